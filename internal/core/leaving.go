package core

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// leave tells a leaving worker to go (once) and deletes it when it has had its
// grace period, or at once when it never started work.
func (d *decision) leave(w *podView) {
	if w.leaveAt.IsZero() {
		w.leaveAt = d.now
		w.leaveReason = w.noticeReason
		if w.noticed {
			w.stopLead = noticeStopLead(d.spec, w, d.checkpointTime(), d.now)
		}
		d.signal(w, w.noticeReason)
	}
	if d.trainsThroughNotice(w) {
		d.requeueAt(stopAt(w))
	}
	act, at := leaveAction(w, LeaveGrace(d.spec), d.now)
	switch act {
	case leaveWait:
		d.requeueAt(at)
	case leavePreempted:
		d.preempted(w, w.giveUpReason())
	case leaveDeleted:
		d.delete(w, w.giveUpReason())
	}
}

// leaveOutcome is what becomes of a worker told to leave (leaveAction).
type leaveOutcome int

const (
	// leaveWait: it still has its grace period; look again then.
	leaveWait leaveOutcome = iota
	// leavePreempted: it goes, counted as a preemption (a noticed node, or
	// a worker that started work and was told to go for a reason that is
	// not a release).
	leavePreempted
	// leaveDeleted: it goes, a release.
	leaveDeleted
)

// leaveAction is the leave rule as a function: a worker that never started
// work (unscheduled, or pending and not ready) goes at once; any other goes
// once its grace period (grace from when it was told, or its node's notice
// deadline when later) is over, and is waited for until then.
func leaveAction(w *podView, grace time.Duration, now time.Time) (leaveOutcome, time.Time) {
	gone := leaveDeleted
	if w.noticed || (w.startedWork() && !isRelease(w.leaveReason)) {
		gone = leavePreempted
	}
	if !w.startedWork() {
		return gone, time.Time{}
	}
	var nodeDeadline time.Time
	if w.noticed {
		nodeDeadline = w.noticeDeadline
	}
	if at := leaveDeadline(grace, w.leaveAt, nodeDeadline); now.Before(at) {
		return leaveWait, at
	}
	return gone, time.Time{}
}

// startedWork: the worker was scheduled and is ready or past Pending.
func (w *podView) startedWork() bool {
	return w.scheduled && (w.ready || w.pod.Status.Phase != corev1.PodPending)
}

// giveUpReason is the reason a worker told to leave is deleted with: when it
// never started work, at once, its notice's reason (on a noticed node) or
// the reason it was told to leave; else the grace period's end.
func (w *podView) giveUpReason() string {
	if !w.startedWork() {
		if w.noticed {
			return w.noticeReason
		}
		return w.leaveReason
	}
	return "LeaveGracePeriodExpired"
}

// leaveDeadline is when a worker told to leave at leaveAt is given up on:
// after the leave grace period, or at the deadline of the notice on the node
// it waits for (its own node's; the launcher's, for a move) when that is
// later: the node lives until then, so a checkpoint longer than the grace
// period still completes (found by the trace simulator).
func leaveDeadline(grace time.Duration, leaveAt, nodeDeadline time.Time) time.Time {
	at := leaveAt.Add(grace)
	if nodeDeadline.After(at) {
		return nodeDeadline
	}
	return at
}

// LeaveGrace is spec.spot.leaveGracePeriodSeconds, 30 s without spec.spot.
func LeaveGrace(spec *etjobv1.ElasticJobSpec) time.Duration {
	if sp := spec.Spot; sp != nil {
		return time.Duration(sp.LeaveGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// lostOnNotReadyNode: maxWaitTime bounds how long a pod on a NotReady node is
// tolerated (0 = no limit; Kubernetes' own taint eviction still applies).
func (d *decision) lostOnNotReadyNode(v *podView) bool {
	expired, at := notReadyTooLong(d.spec, d.now, v)
	if !at.IsZero() {
		d.requeueAt(at)
	}
	return expired
}

// notReadyTooLong is that rule as a function: whether pod v's node has been
// NotReady for maxWaitTime, and, while it has not yet, when it will have
// (zero when the rule does not apply).
func notReadyTooLong(spec *etjobv1.ElasticJobSpec, now time.Time, v *podView) (expired bool, at time.Time) {
	if v.notReadySince.IsZero() || spec.MaxWaitTime <= 0 || v.terminal {
		return false, time.Time{}
	}
	at = v.notReadySince.Add(time.Duration(spec.MaxWaitTime) * time.Second)
	if now.Before(at) {
		return false, at
	}
	return true, time.Time{}
}

// TrainsThroughNotices reports whether the job's workers on a noticed node
// train on until their stop time (spec.spot.noticeLeadTime: Train, the
// default, also without spec.spot).
func TrainsThroughNotices(spec *etjobv1.ElasticJobSpec) bool {
	return spec.Spot == nil || spec.Spot.NoticeLeadTime != etjobv1.NoticeLeadTimeStop
}

// StopMargin is spec.spot.stopMarginSeconds, 15 s when unset.
func StopMargin(spec *etjobv1.ElasticJobSpec) time.Duration {
	if sp := spec.Spot; sp != nil && sp.StopMarginSeconds != nil {
		return time.Duration(*sp.StopMarginSeconds) * time.Second
	}
	return 15 * time.Second
}

// noticeStopLead is how long before its notice's deadline a worker on a
// noticed node stops training: what its cloud keeps back, the longest
// checkpoint write the workers reported (took) and the stop margin, in whole
// seconds. Zero means at once: the job stops at notices (noticeLeadTime
// Stop), the notice has no deadline, no checkpoint was ever reported
// (nothing to plan with), or that time is already here.
func noticeStopLead(spec *etjobv1.ElasticJobSpec, w *podView, took time.Duration, now time.Time) time.Duration {
	if !TrainsThroughNotices(spec) || w.noticeDeadline.IsZero() || !w.ready || took <= 0 {
		return 0
	}
	lead := (NoticeWindows[w.provider].Reserve() + took + StopMargin(spec) + time.Second - 1).Truncate(time.Second)
	if !w.noticeDeadline.Add(-lead).After(now) {
		return 0
	}
	return lead
}

// stopAt is when a worker on a noticed node stops training; zero: at once.
func stopAt(w *podView) time.Time {
	if !w.noticed || w.noticeDeadline.IsZero() || w.stopLead <= 0 {
		return time.Time{}
	}
	return w.noticeDeadline.Add(-w.stopLead)
}

// checkpointTime is the longest checkpoint write the job's status or its
// pods report (0 if none): what a stop must leave time for.
func (d *decision) checkpointTime() time.Duration {
	var took time.Duration
	if c := d.s.Job.Status.LastCheckpoint; c != nil {
		took = time.Duration(c.DurationMilliseconds) * time.Millisecond
	}
	for _, v := range d.all() {
		if c := v.checkpoint; c != nil {
			took = max(took, time.Duration(c.Seconds*float64(time.Second)))
		}
	}
	return took
}

// trainsThroughNotice reports whether a worker on a noticed node is still
// training, and a member, because its stop time has not come.
func (d *decision) trainsThroughNotice(w *podView) bool {
	at := stopAt(w)
	return !at.IsZero() && d.now.Before(at) &&
		w.ready && !w.terminal && !w.deleting && !w.lost && !d.deleted[w.pod.Name]
}
