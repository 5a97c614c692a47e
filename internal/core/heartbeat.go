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

// replaceStalled replaces members that stopped training while the job goes
// on: a member whose heartbeat step has not advanced for HeartbeatStale
// while another member's did (MemberStuck), and, when the reporting members
// have trained in different rounds or world sizes for SplitAfter, the
// members outside the largest world (Split: the newest round among equal
// worlds is kept). A replaced member is deleted, neither a failure nor a
// preemption, and a new worker takes its place; its survivors meet again
// without it. It sets or clears TrainingStalled.
func (d *decision) replaceStalled() {
	ws := d.reporting()
	var stuck []*podView
	freshest := time.Time{}
	for _, w := range ws {
		if w.heartbeat.since.After(freshest) {
			freshest = w.heartbeat.since
		}
	}
	for _, w := range ws {
		at := w.heartbeat.since.Add(HeartbeatStale)
		if !d.now.Before(at) && freshest.After(w.heartbeat.since) && d.now.Sub(freshest) < HeartbeatStale {
			stuck = append(stuck, w)
		} else if d.now.Before(at) {
			d.requeueAt(at)
		}
	}
	split, why := d.splitOff(ws, stuck)
	was := meta.IsStatusConditionTrue(d.st.Conditions, etjobv1.ConditionTrainingStalled)
	switch {
	case len(stuck) > 0:
		msg := fmt.Sprintf("%s stopped advancing: step %d for %s while other members trained on; replacing it",
			names(stuck), stuck[0].heartbeat.step, d.now.Sub(stuck[0].heartbeat.since).Round(time.Second))
		d.stall(etjobv1.ReasonMemberStuck, etjobv1.EventMemberStuck, msg, stuck)
	case len(split) > 0:
		d.stall(etjobv1.ReasonSplit, etjobv1.EventSplit, why, split)
	case was:
		d.setCondition(etjobv1.ConditionTrainingStalled, false, etjobv1.ReasonTraining, "every reporting member advances in one round")
	}
}

// splitOff returns the members to replace when the reporting members that
// train (their step advanced within SplitAfter; less those already stuck)
// do so in more than one (world, round), each for SplitAfter, and the
// reason; nil otherwise.
func (d *decision) splitOff(ws, stuck []*podView) ([]*podView, string) {
	type key struct {
		world int32
		round int64
	}
	groups := map[key][]*podView{}
	settled := true
	for _, w := range ws {
		if slices.Contains(stuck, w) || d.now.Sub(w.heartbeat.since) >= SplitAfter {
			// only members that train now: a rank frozen for a minute still
			// says the world it had (etjob.elastic went on without it), and
			// must not make the members that went on look split off
			continue
		}
		k := key{w.heartbeat.world, w.heartbeat.round}
		groups[k] = append(groups[k], w)
		if at := w.heartbeat.roundSince.Add(SplitAfter); d.now.Before(at) {
			settled = false
			d.requeueAt(at)
		}
	}
	if len(groups) < 2 || !settled {
		return nil, ""
	}
	keys := make([]key, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
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
		SplitAfter, strings.Join(parts, "; "), keys[0].round, keys[0].world)
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
