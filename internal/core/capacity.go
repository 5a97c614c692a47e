package core

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// stopBelowMin: when a running job falls below minReplicas members, every
// remaining worker is told to checkpoint at the step all ranks agree on and
// stop, and the job waits for capacity with pending pods (the seed's "each
// worker receives a signal; rank 0 saves a checkpoint; the job is suspended").
// Idle survivors would otherwise hold their nodes, and torch agents waiting in
// a rendezvous give up after its join timeout. It reports whether it stopped
// any worker: the membership must then be elected again without them.
func (d *decision) stopBelowMin() bool {
	if !d.wasRunning {
		return false
	}
	told := func(w *podView) bool {
		return d.deleted[w.pod.Name] || d.signaled[w.pod.Name] || d.heldForHandover[w.pod.Name]
	}
	stop := belowMinStops(len(d.members), d.spec.MinReplicas, d.workers, told)
	if stop == nil {
		return false
	}
	for _, w := range stop {
		d.signal(w, etjobv1.ReasonWaitingForCapacity)
	}
	stopped := len(stop)
	if d.horovodLauncherLive() && !d.launcherStopped() {
		// horovodrun ends once every rank left: marking it too makes its
		// exit a release whenever it comes (capacity may be back by then),
		// also when its ranks were told to go for another reason (a burst
		// of notices: stopped is then 0).
		d.signal(d.launcher, etjobv1.ReasonWaitingForCapacity)
	}
	if stopped > 0 {
		d.record(etjobv1.TimelineStop, fmt.Sprintf("below spec.minReplicas (%d): %d workers told to checkpoint and stop", d.spec.MinReplicas, stopped))
	}
	return stopped > 0
}

// belowMinStops is the stop below min as a function: with fewer members
// than minReplicas, every ready active worker not already told is told to
// stop (an empty, non-nil list when there is none); nil while the job has
// enough members.
func belowMinStops(members int, min int32, workers []*podView, told func(*podView) bool) []*podView {
	if members >= int(min) {
		return nil
	}
	out := []*podView{}
	for _, w := range workers {
		if w.active() && w.ready && !told(w) {
			out = append(out, w)
		}
	}
	return out
}

// waitVerdict is maxWaitTime's outcome (judgeMaxWait).
type waitVerdict struct {
	// Since is status.belowMinSince after this pass (nil: not below min).
	Since *metav1.Time
	// Release: the wait ran out; the scheduled workers go now.
	Release bool
	// Recheck is when to look again (zero for none).
	Recheck time.Time
}

// judgeMaxWait is spec.maxWaitTime as a function: below minReplicas members,
// scheduled workers are held at most maxWaitTime from since (when the job fell
// below; now when it just did), then released, and the wait starts again.
func judgeMaxWait(spec *etjobv1.ElasticJobSpec, members int, since *metav1.Time, now time.Time) waitVerdict {
	if members >= int(spec.MinReplicas) {
		return waitVerdict{}
	}
	if since == nil {
		since = &metav1.Time{Time: now}
	}
	if spec.MaxWaitTime <= 0 {
		return waitVerdict{Since: since}
	}
	wait := time.Duration(spec.MaxWaitTime) * time.Second
	if at := since.Add(wait); now.Before(at) {
		return waitVerdict{Since: since, Recheck: at}
	}
	return waitVerdict{Since: &metav1.Time{Time: now}, Release: true, Recheck: now.Add(wait)}
}

// waitForCapacity applies maxWaitTime while the job is below minReplicas
// members: scheduled workers are held at most that long, then released; the
// job keeps waiting with pending pods. It reports whether it released any
// worker: the membership must then be elected again without them.
func (d *decision) waitForCapacity() bool {
	v := judgeMaxWait(d.spec, len(d.members), d.belowMinSince(), d.now)
	d.wait = &v
	if !v.Recheck.IsZero() {
		d.requeueAt(v.Recheck)
	}
	if !v.Release {
		return false
	}
	released := 0
	for _, w := range d.workers {
		if w.scheduled && w.active() && !d.deleted[w.pod.Name] {
			d.delete(w, etjobv1.ReasonMaxWaitTimeExceeded)
			released++
		}
	}
	if released > 0 {
		msg := fmt.Sprintf("below spec.minReplicas (%d) for spec.maxWaitTime (%ds): released %d idle workers; waiting with pending pods",
			d.spec.MinReplicas, d.spec.MaxWaitTime, released)
		d.event(true, etjobv1.EventMaxWaitTimeExceeded, msg)
		d.record(etjobv1.TimelineRelease, msg)
	}
	return released > 0
}
