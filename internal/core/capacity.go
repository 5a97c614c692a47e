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
// any worker: the membership must then be published again without them.
func (d *decision) stopBelowMin() bool {
	if !d.wasRunning || len(d.members) >= int(d.spec.MinReplicas) {
		return false
	}
	stopped := 0
	for _, w := range d.workers {
		if w.active() && w.ready && !d.deleted[w.pod.Name] && !d.signaled[w.pod.Name] && !d.heldForHandover[w.pod.Name] {
			d.signal(w, etjobv1.ReasonWaitingForCapacity)
			stopped++
		}
	}
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

// waitForCapacity applies maxWaitTime while the job is below minReplicas
// members: scheduled workers are held at most that long, then released; the
// job keeps waiting with pending pods. It reports whether it released any
// worker: the membership must then be published again without them.
func (d *decision) waitForCapacity() bool {
	if len(d.members) >= int(d.spec.MinReplicas) {
		d.st.BelowMinSince = nil
		return false
	}
	if d.st.BelowMinSince == nil {
		d.st.BelowMinSince = &metav1.Time{Time: d.now}
	}
	if d.spec.MaxWaitTime <= 0 {
		return false
	}
	at := d.st.BelowMinSince.Add(time.Duration(d.spec.MaxWaitTime) * time.Second)
	if d.now.Before(at) {
		d.requeueAt(at)
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
	d.st.BelowMinSince = &metav1.Time{Time: d.now}
	d.requeueAt(d.now.Add(time.Duration(d.spec.MaxWaitTime) * time.Second))
	return released > 0
}
