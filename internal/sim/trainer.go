package sim

import (
	"slices"
	"time"
)

// phase is where the training processes of an elastic torchrun job are.
type phase int

const (
	// waiting: fewer than minReplicas members; nothing trains.
	waiting phase = iota
	// restarting: the members re-rendezvous and load the checkpoint.
	restarting
	// running: the group trains; the phase ends at the next periodic checkpoint.
	running
	// stopping: a membership change was published; the group trains on until
	// the step all ranks agree to stop at (NoticeStop later).
	stopping
	// checkpointing: the group writes a checkpoint (every rank its shard).
	checkpointing
)

// trainer is the training model on top of the cluster model. It follows the
// membership that Decide publishes: every change is a torchrun restart, which
// etjob makes lossless by stopping at an agreed step and checkpointing first
// (docs/design.md, Membership); a member whose processes die before that
// checkpoint is written is a hard loss, rolled back to the last completed
// checkpoint. Periodic checkpoints guard against hard losses.
type trainer struct {
	w     *elastic
	phase phase
	// group: the ranks of the current world (running, stopping,
	// checkpointing) or the members it restarts with (restarting).
	group []string
	// target: the membership Decide published last.
	target   []string
	gen      int
	end      time.Duration
	periodic bool
	since    time.Duration
	interval time.Duration
	// trained is the group's training time since the last checkpoint: the
	// periodic checkpoint is due when it reaches interval (etjob.elastic
	// regroups without a checkpoint, so this spans its generations).
	trained time.Duration
	led     ledger
}

// member reports whether the pod is in the published membership or the group.
func (t *trainer) member(pod string) bool {
	return slices.Contains(t.target, pod) || slices.Contains(t.group, pod)
}

// needs reports whether the pod's processes are needed by the training: it
// is a rank that trains or writes its part of a checkpoint.
func (t *trainer) needs(pod string) bool {
	return (t.phase == running || t.phase == stopping || t.phase == checkpointing) && slices.Contains(t.group, pod)
}

func (t *trainer) until(at time.Duration) {
	t.gen++
	t.end = at
	t.w.q.push(at, evTrain, "", t.gen)
}

// accrue counts the group's training from since to now.
func (t *trainer) accrue(now time.Duration) {
	if t.phase == running || t.phase == stopping {
		t.led.train(len(t.group), now-t.since)
		t.trained += now - t.since
	}
	t.since = now
}

func (t *trainer) enter(now time.Duration, ph phase) {
	t.phase = ph
	t.led.state(now, ph == waiting, ph == restarting || ph == checkpointing)
}

// setTarget follows a membership that Decide published.
func (t *trainer) setTarget(now time.Duration, hosts []string) {
	if slices.Equal(hosts, t.target) {
		return
	}
	for _, h := range hosts {
		if t.phase != waiting && !slices.Contains(t.target, h) {
			t.led.joins++
		}
	}
	t.target = slices.Clone(hosts)
	lo := int(t.w.p.MinReplicas)
	switch t.phase {
	case waiting:
		if len(hosts) >= lo {
			t.restart(now, t.w.p.ResumePause)
		}
	case restarting:
		if len(hosts) < lo {
			t.wait(now)
			return
		}
		t.group = slices.Clone(hosts)
		t.until(max(t.end, now+t.w.p.ResumePause))
	case running:
		if !slices.Equal(hosts, t.group) {
			if joinOnly(t.group, hosts) {
				t.led.joinRestarts++
			}
			t.accrue(now)
			t.enter(now, stopping)
			t.until(now + t.w.p.NoticeStop)
		}
	}
	// stopping, checkpointing: the restart after the checkpoint uses the
	// latest target.
}

// joinOnly reports whether every member of group stays in hosts.
func joinOnly(group, hosts []string) bool {
	for _, g := range group {
		if !slices.Contains(hosts, g) {
			return false
		}
	}
	return true
}

func (t *trainer) restart(now, pause time.Duration) {
	t.led.restarts++
	t.group = slices.Clone(t.target)
	t.enter(now, restarting)
	t.until(now + pause)
}

func (t *trainer) wait(now time.Duration) {
	t.group = nil
	t.gen++ // cancels the phase's end
	t.enter(now, waiting)
}

// phaseEnd moves the training on when a phase's time is up.
func (t *trainer) phaseEnd(gen int) {
	if gen != t.gen {
		return
	}
	now := t.w.now
	switch t.phase {
	case restarting:
		t.group = slices.Clone(t.target)
		t.enter(now, running)
		t.since = now
		t.until(now + max(t.interval-t.trained, 0))
	case running: // a periodic checkpoint is due
		t.accrue(now)
		t.periodic = true
		t.enter(now, checkpointing)
		t.until(now + t.w.p.CheckpointTime)
	case stopping:
		t.accrue(now)
		if t.inProcess() && len(t.target) >= int(t.w.p.MinReplicas) {
			// etjob.elastic: the leavers go at the agreed commit, and the
			// others regroup in their processes, without a checkpoint.
			t.exitLeavers()
			t.restart(now, t.regroupPause())
			return
		}
		t.periodic = false
		t.enter(now, checkpointing)
		t.until(now + t.w.p.CheckpointTime)
	case checkpointing:
		t.led.checkpoint()
		t.trained = 0
		if len(t.group) > 0 {
			t.w.reportCheckpoint(t.group[0], int64(t.led.committed/t.w.p.Rate)+1, len(t.group))
		}
		// The leavers' part is written: they exit with the reserved code;
		// a member that trains through its notice stays until its stop.
		t.exitLeavers()
		switch {
		case t.periodic && slices.Equal(t.target, t.group):
			t.enter(now, running)
			t.since = now
			t.until(now + t.interval)
		case len(t.target) >= int(t.w.p.MinReplicas) && t.inProcess():
			t.restart(now, t.regroupPause())
		case len(t.target) >= int(t.w.p.MinReplicas):
			t.restart(now, t.w.p.ResumePause)
		default:
			t.wait(now)
		}
	}
}

func (t *trainer) inProcess() bool { return t.w.p.Recovery == RecoveryInProcess }

// regroupPause is etjob.elastic's pause for a new generation with the
// target's members: the regroup, and the state's broadcast when one joins.
func (t *trainer) regroupPause() time.Duration {
	if joinOnly(t.target, t.group) {
		return t.w.p.RegroupPause
	}
	return t.w.p.RegroupPause + t.w.p.BroadcastTime
}

// exitLeavers ends the group's leavers that left the target: they exit with
// the reserved code; a member that trains through its notice stays until
// its stop.
func (t *trainer) exitLeavers() {
	for _, pod := range t.group {
		if p := t.w.pods[pod]; p != nil && t.w.leaving(p) && !slices.Contains(t.target, pod) {
			t.w.exit(pod)
		}
	}
}

// podGone is a worker's processes ending without a graceful exit: its node
// died, or its pod was deleted. If the training needed it, that is a hard
// loss: the work since the last completed checkpoint is lost and the
// survivors restart after HardPause. It reports whether the training lost a
// member.
func (t *trainer) podGone(now time.Duration, pod string) bool {
	inGroup := slices.Contains(t.group, pod)
	t.target = slices.DeleteFunc(t.target, func(s string) bool { return s == pod })
	if !inGroup {
		return false
	}
	lo := int(t.w.p.MinReplicas)
	switch t.phase {
	case running, stopping, checkpointing:
		t.accrue(now)
		if t.inProcess() && len(t.target) >= lo {
			// etjob.elastic: the survivors roll back to their in-memory
			// commit, the step in flight, and regroup; a leaver goes at it.
			t.led.rollbackStep(len(t.group), t.w.p.StepTime)
			t.group = slices.DeleteFunc(t.group, func(s string) bool { return s == pod })
			t.exitLeavers()
			t.restart(now, max(t.w.p.InProcessHardPause, t.regroupPause()))
			return true
		}
		if t.phase == checkpointing {
			t.led.failed++
		}
		t.led.rollback()
		t.trained = 0
		t.group = slices.DeleteFunc(t.group, func(s string) bool { return s == pod })
		// Leavers whose checkpoint failed go anyway: lost, not saved.
		for _, other := range t.group {
			if p := t.w.pods[other]; p != nil && t.w.leaving(p) {
				t.w.hardNode[p.Spec.NodeName] = true
				t.w.exit(other)
			}
		}
		if len(t.target) >= lo {
			t.restart(now, t.w.p.HardPause)
		} else {
			t.wait(now)
		}
	case restarting:
		t.group = slices.DeleteFunc(t.group, func(s string) bool { return s == pod })
		if len(t.target) < lo {
			t.wait(now)
		} else {
			t.until(max(t.end, now+t.w.p.HardPause))
		}
	}
	return true
}

// finish accounts the training up to the end of the trace.
func (t *trainer) finish(span time.Duration) {
	t.accrue(span)
}
