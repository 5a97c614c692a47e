package core

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// leave tells a leaving worker to go (once) and deletes it when it has had its
// grace period, or at once when it never started work.
func (d *decision) leave(w *podView) {
	if w.leaveAt.IsZero() {
		w.leaveAt = d.now
		w.leaveReason = w.noticeReason
		d.signal(w, w.noticeReason)
	}
	if !w.scheduled || (!w.ready && w.pod.Status.Phase == corev1.PodPending) {
		if w.noticed {
			d.preempted(w, w.noticeReason)
		} else {
			d.delete(w, w.leaveReason)
		}
		return
	}
	var nodeDeadline time.Time
	if w.noticed {
		nodeDeadline = w.noticeDeadline
	}
	at := d.leaveDeadline(w.leaveAt, nodeDeadline)
	if d.now.Before(at) {
		d.requeueAt(at)
		return
	}
	if w.noticed || !isRelease(w.leaveReason) {
		d.preempted(w, "LeaveGracePeriodExpired")
	} else {
		d.delete(w, "LeaveGracePeriodExpired")
	}
}

// leaveDeadline is when a worker told to leave at leaveAt is given up on:
// after the leave grace period, or at the deadline of the notice on the node
// it waits for (its own node's; the launcher's, for a move) when that is
// later: the node lives until then, so a checkpoint longer than the grace
// period still completes (found by the trace simulator).
func (d *decision) leaveDeadline(leaveAt, nodeDeadline time.Time) time.Time {
	at := leaveAt.Add(d.leaveGrace())
	if nodeDeadline.After(at) {
		return nodeDeadline
	}
	return at
}

// leaveGrace is spec.spot.leaveGracePeriodSeconds, 30 s without spec.spot.
func (d *decision) leaveGrace() time.Duration {
	if sp := d.spec.Spot; sp != nil {
		return time.Duration(sp.LeaveGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// lostOnNotReadyNode: maxWaitTime bounds how long a pod on a NotReady node is
// tolerated (0 = no limit; Kubernetes' own taint eviction still applies).
func (d *decision) lostOnNotReadyNode(v *podView) bool {
	if v.notReadySince.IsZero() || d.spec.MaxWaitTime <= 0 || v.terminal {
		return false
	}
	at := v.notReadySince.Add(time.Duration(d.spec.MaxWaitTime) * time.Second)
	if d.now.Before(at) {
		d.requeueAt(at)
		return false
	}
	return true
}
