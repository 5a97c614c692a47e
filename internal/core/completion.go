package core

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// finished reports whether the job is Complete or Failed: nothing but its
// cleanup and its TTL is decided for it any more.
func (d *decision) finished() bool { return FinishedCondition(d.st.Conditions) != nil }

// FinishedCondition returns a finished job's Complete or Failed condition,
// nil while it is not finished: a finished job neither runs nor scales.
func FinishedCondition(conds []metav1.Condition) *metav1.Condition {
	for _, t := range []string{etjobv1.ConditionComplete, etjobv1.ConditionFailed} {
		if c := meta.FindStatusCondition(conds, t); c != nil && c.Status == metav1.ConditionTrue {
			return c
		}
	}
	return nil
}

// FinishedRefusal says why a finished job cannot be scaled, naming its state
// and the condition's words; "" while it is not finished.
func FinishedRefusal(job *etjobv1.ElasticJob) string {
	c := FinishedCondition(job.Status.Conditions)
	if c == nil {
		return ""
	}
	state := "completed"
	if c.Type == etjobv1.ConditionFailed {
		state = "failed"
	}
	msg := fmt.Sprintf("ElasticJob %q has %s (%s", job.Name, state, c.Reason)
	if c.Message != "" {
		msg += ": " + c.Message
	}
	return msg + "): a finished job does not scale; submit it again to train more"
}

// deadlineExceeded fails the job once it has been active for
// spec.activeDeadlineSeconds (batch/v1 Job parity), and otherwise asks to
// look again at that deadline.
func (d *decision) deadlineExceeded() bool {
	ad := d.spec.ActiveDeadlineSeconds
	if ad == nil {
		return false
	}
	at := d.st.StartTime.Add(time.Duration(*ad) * time.Second)
	if !d.now.Before(at) {
		d.fail(etjobv1.ReasonDeadlineExceeded, fmt.Sprintf("job was active longer than spec.activeDeadlineSeconds (%ds)", *ad))
		return true
	}
	d.requeueAt(at)
	return false
}

// handleCompletion: for torchrun the first worker that exits 0 starts
// completion; the job completes when no member still runs, or after a grace
// period. It reports ended when the job completed, hold while the other
// members finish (the pass then publishes them: they leave the membership as
// they finish).
func (d *decision) handleCompletion() outcome {
	if d.spec.Framework != etjobv1.FrameworkTorchrun {
		return proceed
	}
	var first time.Time
	found := false
	running := 0
	for _, w := range d.workers {
		if w.succeeded {
			t := w.finishedAt
			if t.IsZero() {
				t = d.now
			}
			if !found || t.Before(first) {
				first = t
			}
			found = true
		} else if !w.terminal && !w.deleting && !d.deleted[w.pod.Name] && w.scheduled {
			running++
		}
	}
	if !found {
		return proceed
	}
	at := first.Add(CompletionGracePeriod)
	if running == 0 || !d.now.Before(at) {
		d.complete("a worker exited 0 and the other members finished")
		return ended
	}
	d.requeueAt(at)
	// Members leave the membership as they finish: that is completion, not a
	// fall below min.
	msg := fmt.Sprintf("a worker exited 0: waiting up to %s for the %d others to finish", CompletionGracePeriod, running)
	d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonCompleting, msg)
	d.setCondition(etjobv1.ConditionResizing, false, etjobv1.ReasonCompleting, msg)
	return hold
}

// complete finishes the job as Complete, with a Normal Completed Event.
func (d *decision) complete(msg string) {
	d.setCondition(etjobv1.ConditionComplete, true, etjobv1.ReasonSucceeded, msg)
	d.finishWith(etjobv1.TimelineComplete, etjobv1.EventCompleted, msg, false)
}

// fail finishes the job as Failed with the given condition reason, with a
// Warning Failed Event.
func (d *decision) fail(reason, msg string) {
	d.setCondition(etjobv1.ConditionFailed, true, reason, msg)
	d.finishWith(etjobv1.TimelineFail, etjobv1.EventFailed, msg, true)
}

// finishWith ends the job: its timeline entry of the given kind, its Event,
// and the cleanup of a finished job. The Event's reason is a constant, not
// derived from the timeline kind ("Fail"+"d" read "Faild", issue #12).
func (d *decision) finishWith(kind string, reason etjobv1.EventReason, msg string, warning bool) {
	d.st.CompletionTime = &metav1.Time{Time: d.now}
	d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonFinished, msg)
	d.setCondition(etjobv1.ConditionResizing, false, etjobv1.ReasonFinished, msg)
	d.setCondition(etjobv1.ConditionSuspended, false, etjobv1.ReasonFinished, msg)
	d.st.BelowMinSince = nil
	d.record(kind, msg)
	d.event(warning, reason, msg)
	d.finish()
}

// finish cleans up a finished job per cleanPodPolicy and applies its TTL.
func (d *decision) finish() {
	d.setHosts(nil)
	for _, v := range d.all() {
		switch d.spec.CleanPodPolicy {
		case etjobv1.CleanPodPolicyAll:
			d.delete(v, etjobv1.ReasonFinished)
		case etjobv1.CleanPodPolicyNone:
		default: // Running
			if !v.terminal {
				d.delete(v, etjobv1.ReasonFinished)
			}
		}
	}
	if ttl := d.spec.TTLSecondsAfterFinished; ttl != nil && d.st.CompletionTime != nil {
		at := d.st.CompletionTime.Add(time.Duration(*ttl) * time.Second)
		if !d.now.Before(at) {
			d.plan.DeleteJob = true
		} else {
			d.requeueAt(at)
		}
	}
}
