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
func (d *decision) finished() bool { return FinishedCondition(d.conds) != nil }

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

// activeDeadline is spec.activeDeadlineSeconds (batch/v1 Job parity) as a
// function: whether a job active since start has run out of it at now, the
// message that fails it, and otherwise when it will (zero without one).
func activeDeadline(spec *etjobv1.ElasticJobSpec, start, now time.Time) (exceeded bool, msg string, at time.Time) {
	ad := spec.ActiveDeadlineSeconds
	if ad == nil {
		return false, "", time.Time{}
	}
	at = start.Add(time.Duration(*ad) * time.Second)
	if !now.Before(at) {
		return true, fmt.Sprintf("job was active longer than spec.activeDeadlineSeconds (%ds)", *ad), time.Time{}
	}
	return false, "", at
}

// deadlineExceeded fails the job once it has been active for
// spec.activeDeadlineSeconds, and otherwise asks to look again at that
// deadline.
func (d *decision) deadlineExceeded() bool {
	exceeded, msg, at := activeDeadline(d.spec, d.startTime().Time, d.now)
	if exceeded {
		d.fail(etjobv1.ReasonDeadlineExceeded, msg)
		return true
	}
	if !at.IsZero() {
		d.requeueAt(at)
	}
	return false
}

// completionVerdict is the torchrun completion policy's outcome
// (judgeCompletion).
type completionVerdict struct {
	// Started: a worker exited 0.
	Started bool
	// Done: the job completes now (no other member runs, or the grace
	// period is over).
	Done bool
	// Running are the members still running while it is not done, and
	// Until when the grace period ends.
	Running int
	Until   time.Time
}

// judgeCompletion is torchrun's completion rule: the first worker that exits
// 0 starts completion, and the job completes when no other scheduled worker
// still runs, or CompletionGracePeriod after that first exit. gone are the
// workers this pass already deletes.
func judgeCompletion(workers []*podView, gone map[string]bool, now time.Time) completionVerdict {
	var first time.Time
	var v completionVerdict
	for _, w := range workers {
		if w.succeeded {
			t := w.finishedAt
			if t.IsZero() {
				t = now
			}
			if !v.Started || t.Before(first) {
				first = t
			}
			v.Started = true
		} else if !w.terminal && !w.deleting && !gone[w.pod.Name] && w.scheduled {
			v.Running++
		}
	}
	if !v.Started {
		return completionVerdict{}
	}
	v.Until = first.Add(CompletionGracePeriod)
	v.Done = v.Running == 0 || !now.Before(v.Until)
	return v
}

// handleCompletion applies judgeCompletion to a torchrun job. It reports
// ended when the job completed, hold while the other members finish (the
// pass then elects them: they leave the membership as they finish).
func (d *decision) handleCompletion() outcome {
	if d.spec.Framework != etjobv1.FrameworkTorchrun {
		return proceed
	}
	v := judgeCompletion(d.workers, d.deleted, d.now)
	switch {
	case !v.Started:
		return proceed
	case v.Done:
		d.complete("a worker exited 0 and the other members finished")
		return ended
	}
	d.requeueAt(v.Until)
	// Members leave the membership as they finish: that is completion, not a
	// fall below min.
	msg := fmt.Sprintf("a worker exited 0: waiting up to %s for the %d others to finish", CompletionGracePeriod, v.Running)
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
	d.finishedNow = true
	d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonFinished, msg)
	d.setCondition(etjobv1.ConditionResizing, false, etjobv1.ReasonFinished, msg)
	d.setCondition(etjobv1.ConditionSuspended, false, etjobv1.ReasonFinished, msg)
	d.record(kind, msg)
	d.event(warning, reason, msg)
	d.finish()
}

// cleanup is spec.cleanPodPolicy as a function: the pods of a finished job
// to delete (All: every pod; None: none; Running, the default: those still
// running).
func cleanup(policy etjobv1.CleanPodPolicy, pods []*podView) []*podView {
	var out []*podView
	for _, v := range pods {
		switch policy {
		case etjobv1.CleanPodPolicyAll:
			out = append(out, v)
		case etjobv1.CleanPodPolicyNone:
		default: // Running
			if !v.terminal {
				out = append(out, v)
			}
		}
	}
	return out
}

// ttlAfterFinished is spec.ttlSecondsAfterFinished as a function: whether a
// job finished at completed is to be deleted at now, and otherwise when
// (zero without a TTL).
func ttlAfterFinished(spec *etjobv1.ElasticJobSpec, completed *metav1.Time, now time.Time) (deleteJob bool, at time.Time) {
	ttl := spec.TTLSecondsAfterFinished
	if ttl == nil || completed == nil {
		return false, time.Time{}
	}
	at = completed.Add(time.Duration(*ttl) * time.Second)
	if !now.Before(at) {
		return true, time.Time{}
	}
	return false, at
}

// finish cleans up a finished job per cleanPodPolicy and applies its TTL.
func (d *decision) finish() {
	d.clearMembers()
	for _, v := range cleanup(d.spec.CleanPodPolicy, d.all()) {
		d.delete(v, etjobv1.ReasonFinished)
	}
	deleteJob, at := ttlAfterFinished(d.spec, d.completionTime(), d.now)
	d.deleteJob = deleteJob
	if !at.IsZero() {
		d.requeueAt(at)
	}
}
