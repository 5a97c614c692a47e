package core

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// suspend releases every pod while spec.suspend is true (batch/v1 Job parity).
func (d *decision) suspend() {
	for _, v := range d.all() {
		d.delete(v, etjobv1.ReasonUserSuspended)
	}
	if c := meta.FindStatusCondition(d.conds, etjobv1.ConditionSuspended); c == nil ||
		c.Status != metav1.ConditionTrue || c.Reason != etjobv1.ReasonUserSuspended {
		d.record(etjobv1.TimelineSuspend, "suspended by spec.suspend")
		d.event(false, etjobv1.EventSuspended, "job suspended: all pods released")
	}
	d.clearMembers()
	// status.startTime and belowMinSince go, and a resumed job's first
	// launcher replaces none (build).
	d.suspended = true
	d.setCondition(etjobv1.ConditionSuspended, true, etjobv1.ReasonUserSuspended, "spec.suspend is true")
	d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonUserSuspended, "spec.suspend is true")
	d.setCondition(etjobv1.ConditionResizing, false, etjobv1.ReasonUserSuspended, "spec.suspend is true")
}

// resume starts the job's active time (status.startTime, from which
// spec.activeDeadlineSeconds counts) when it has none: a new job, or one whose
// spec.suspend was set back to false, which the timeline and an Event tell.
func (d *decision) resume() {
	if d.s.Job.Status.StartTime != nil {
		return
	}
	d.resumed = true
	if c := meta.FindStatusCondition(d.conds, etjobv1.ConditionSuspended); c != nil &&
		c.Status == metav1.ConditionTrue && c.Reason == etjobv1.ReasonUserSuspended {
		d.record(etjobv1.TimelineResume, "spec.suspend set to false")
		d.event(false, etjobv1.EventResumed, "job resumed")
		d.setCondition(etjobv1.ConditionSuspended, false, etjobv1.ReasonNotSuspended, "")
	}
}
