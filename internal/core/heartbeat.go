package core

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

const (
	// HeartbeatStale is how long a member's heartbeat step may stay the same
	// while another member's advanced before the member counts as stuck and
	// is replaced. The node agent publishes an advancing step at most every
	// 30 s (agent.HeartbeatInterval), so a member that trains is never older
	// than that plus one poll.
	HeartbeatStale = 2 * time.Minute
	// SplitAfter is how long members must have reported different rounds or
	// world sizes, each without change, before the job counts as split (a
	// membership change passes through different rounds for seconds).
	SplitAfter = time.Minute
)

// heartbeat is a worker's parsed heartbeat annotation.
type heartbeat struct {
	step       int64
	world      int32
	round      int64
	since      time.Time
	roundSince time.Time
}

// parseHeartbeat reads a pod's AnnotationHeartbeat; nil when absent or
// malformed (such a pod is exempt, as one whose script never reports).
func parseHeartbeat(raw string) *heartbeat {
	if raw == "" {
		return nil
	}
	a := etjobv1.HeartbeatAnnotation{}
	if json.Unmarshal([]byte(raw), &a) != nil {
		return nil
	}
	since, err1 := time.Parse(time.RFC3339, a.Since)
	roundSince, err2 := time.Parse(time.RFC3339, a.RoundSince)
	if err1 != nil || err2 != nil {
		return nil
	}
	return &heartbeat{step: a.Step, world: a.World, round: a.Round, since: since, roundSince: roundSince}
}

// reporting lists the published members that are ready, not leaving and not
// deleted this pass and that report a heartbeat: the only workers the
// heartbeat rules look at. Joiners held for admission, pods not yet ready
// and scripts that never report are exempt.
func (d *decision) reporting() []*podView {
	published := map[string]bool{}
	for _, h := range d.s.Job.Status.Membership.Hosts {
		published[HostName(h)] = true
	}
	var out []*podView
	for _, w := range d.workers {
		if w.heartbeat != nil && published[w.pod.Name] && w.ready && w.active() && !w.leaving() &&
			!d.deleted[w.pod.Name] && !d.signaled[w.pod.Name] {
			out = append(out, w)
		}
	}
	return out
}

// stallVerdict is the heartbeat policy's outcome (judgeHeartbeats): the
// members to replace and why, or none, and when to look again.
type stallVerdict struct {
	// Replace are the members to delete; empty when every reporting member
	// trains in one round.
	Replace []*podView
	// Reason (etjobv1.ReasonMemberStuck or ReasonSplit), Event and Message
	// say why, when Replace is not empty.
	Reason  string
	Event   etjobv1.EventReason
	Message string
	// Recheck is the earliest time at which the verdict can change (a member
	// that turns stale, a round that settles); zero for none.
	Recheck time.Time
}

// judgeHeartbeats is the heartbeat policy, a function of the reporting
// members (reporting) and the time alone: a member whose heartbeat step has
// not advanced for HeartbeatStale while another member's did is stuck
// (MemberStuck); when the members that train have done so in different
// rounds or world sizes for SplitAfter, those outside the group most of
// them report are split off (Split: among groups as large, the largest
// world, then the newest round, is kept). Stuck
// members come first: a split is judged without them.
func judgeHeartbeats(ws []*podView, now time.Time) stallVerdict {
	var v stallVerdict
	recheck := func(t time.Time) {
		if v.Recheck.IsZero() || t.Before(v.Recheck) {
			v.Recheck = t
		}
	}
	var stuck []*podView
	freshest := time.Time{}
	for _, w := range ws {
		if w.heartbeat.since.After(freshest) {
			freshest = w.heartbeat.since
		}
	}
	for _, w := range ws {
		at := w.heartbeat.since.Add(HeartbeatStale)
		if !now.Before(at) && freshest.After(w.heartbeat.since) && now.Sub(freshest) < HeartbeatStale {
			stuck = append(stuck, w)
		} else if now.Before(at) {
			recheck(at)
		}
	}
	split, why, settles := splitOff(ws, stuck, now)
	if !settles.IsZero() {
		recheck(settles)
	}
	switch {
	case len(stuck) > 0:
		v.Replace, v.Reason, v.Event = stuck, etjobv1.ReasonMemberStuck, etjobv1.EventMemberStuck
		v.Message = fmt.Sprintf("%s stopped advancing: step %d for %s while other members trained on; replacing it",
			names(stuck), stuck[0].heartbeat.step, now.Sub(stuck[0].heartbeat.since).Round(time.Second))
	case len(split) > 0:
		v.Replace, v.Reason, v.Event, v.Message = split, etjobv1.ReasonSplit, etjobv1.EventSplit, why
	}
	return v
}

// replaceStalled applies judgeHeartbeats to this pass's reporting members: a
// replaced member is deleted, neither a failure nor a preemption, and a new
// worker takes its place; its survivors meet again without it. It sets or
// clears TrainingStalled.
func (d *decision) replaceStalled() {
	v := judgeHeartbeats(d.reporting(), d.now)
	if !v.Recheck.IsZero() {
		d.requeueAt(v.Recheck)
	}
	switch {
	case len(v.Replace) > 0:
		d.stall(v.Reason, v.Event, v.Message, v.Replace)
	case meta.IsStatusConditionTrue(d.conds, etjobv1.ConditionTrainingStalled):
		d.setCondition(etjobv1.ConditionTrainingStalled, false, etjobv1.ReasonTraining, "every reporting member advances in one round")
	}
}

// splitOff returns the members to replace when the reporting members that
// train (their step advanced within SplitAfter; less those already stuck)
// do so in more than one (world, round), each for SplitAfter, and the
// reason; nil otherwise, with the time the rounds settle while one has not.
func splitOff(ws, stuck []*podView, now time.Time) ([]*podView, string, time.Time) {
	type key struct {
		world int32
		round int64
	}
	groups := map[key][]*podView{}
	var settles time.Time
	for _, w := range ws {
		if slices.Contains(stuck, w) || now.Sub(w.heartbeat.since) >= SplitAfter {
			// only members that train now: a rank frozen for a minute still
			// says the world it had (etjob.elastic went on without it), and
			// must not make the members that went on look split off
			continue
		}
		k := key{w.heartbeat.world, w.heartbeat.round}
		groups[k] = append(groups[k], w)
		if at := w.heartbeat.roundSince.Add(SplitAfter); now.Before(at) && (settles.IsZero() || at.Before(settles)) {
			settles = at
		}
	}
	if len(groups) < 2 || !settles.IsZero() {
		return nil, "", settles
	}
	keys := make([]key, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	// The group most members report is kept, then the largest world, then
	// the newest round: honest members of a world of W are W reports, so the
	// count agrees with the world for them, and one member that claims a
	// world or a round of its own (a rooted node's heartbeat, issue #42 M3)
	// is outnumbered instead of making the others look split off.
	sort.Slice(keys, func(i, j int) bool {
		if a, b := len(groups[keys[i]]), len(groups[keys[j]]); a != b {
			return a > b
		}
		if keys[i].world != keys[j].world {
			return keys[i].world > keys[j].world
		}
		return keys[i].round > keys[j].round
	})
	var parts []string
	var off []*podView
	for i, k := range keys {
		parts = append(parts, fmt.Sprintf("%s in round %d, world %d", names(groups[k]), k.round, k.world))
		if i > 0 {
			off = append(off, groups[k]...)
		}
	}
	return off, fmt.Sprintf("members train apart for over %s: %s; replacing those outside round %d (world %d)",
		SplitAfter, strings.Join(parts, "; "), keys[0].round, keys[0].world), time.Time{}
}

// stall replaces members that stopped training (replaceStalled).
func (d *decision) stall(reason string, event etjobv1.EventReason, msg string, ws []*podView) {
	for _, w := range ws {
		d.delete(w, reason)
	}
	d.record(etjobv1.TimelineLeave, msg)
	d.event(true, event, msg)
	d.setCondition(etjobv1.ConditionTrainingStalled, true, reason, msg)
}

// training counts the members whose heartbeat advanced within
// HeartbeatStale (status.training); nil when no member reports one.
func (d *decision) training() *int32 {
	var n int32
	any := false
	for _, w := range d.members {
		if w.heartbeat == nil {
			continue
		}
		any = true
		if d.now.Sub(w.heartbeat.since) < HeartbeatStale {
			n++
		}
	}
	if !any {
		return nil
	}
	return &n
}

func names(ws []*podView) string {
	out := make([]string, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.pod.Name)
	}
	return strings.Join(out, ", ")
}
