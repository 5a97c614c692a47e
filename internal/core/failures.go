package core

import (
	"fmt"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// deleteStale deletes the pods of earlier attempts: a restart goes on, with
// new pods, once they are gone.
func (d *decision) deleteStale() {
	for _, v := range d.stale {
		d.restarting = true
		d.delete(v, etjobv1.ReasonRestarting)
	}
}

// handleWorkers classifies finished, lost and leaving workers. It reports
// ended when the job restarted or finished.
func (d *decision) handleWorkers() outcome {
	for _, w := range d.workers {
		if w.deleting {
			continue
		}
		switch {
		case w.terminal && w.succeeded:
			// completion, below
		case w.released:
			d.delete(w, w.leaveReason)
		case w.terminal && w.preempted:
			d.preempted(w, w.preemptReason)
		case w.terminal:
			if d.workerFailed(w) {
				return ended
			}
		case w.lost:
			d.preempted(w, w.lostReason)
		case d.lostOnNotReadyNode(w):
			d.preempted(w, "NodeNotReady")
		case w.leaving():
			d.leave(w)
		}
	}
	return proceed
}

// preempted deletes a worker lost to a preemption, counted as one and never
// as a failure.
func (d *decision) preempted(w *podView, reason string) {
	d.delete(w, reason)
	d.countPreemption(w)
	d.record(etjobv1.TimelineLeave, fmt.Sprintf("%s preempted (%s)", w.pod.Name, reason))
	d.event(false, etjobv1.EventPreempted, fmt.Sprintf("worker %s preempted (%s); not counted as a failure", w.pod.Name, reason))
}

// failureAction is what a worker's failure (one that is not a preemption)
// does to the job (judgeFailure).
type failureAction int

const (
	// replaceWorker: the worker is replaced under a new name.
	replaceWorker failureAction = iota
	// restartJob: every pod goes and the job starts again.
	restartJob
	// failOverBackoff: the failures exceed spec.backoffLimit.
	failOverBackoff
	// failByPolicy: the restart policies allow neither.
	failByPolicy
)

// judgeFailure is workerRestartPolicy, restartPolicy and backoffLimit as a
// function of the spec, the failures counted with this one, and the
// worker's exit code.
func judgeFailure(spec *etjobv1.ElasticJobSpec, failures, exitCode int32) failureAction {
	if failures > BackoffLimit(spec) {
		return failOverBackoff
	}
	switch spec.WorkerRestartPolicy {
	case etjobv1.WorkerRestartAlways, etjobv1.WorkerRestartOnFailure:
		return replaceWorker
	case etjobv1.WorkerRestartExitCode:
		if retryableExit(exitCode) {
			return replaceWorker
		}
	}
	if spec.RestartPolicy == etjobv1.RestartPolicyOnFailure {
		return restartJob
	}
	return failByPolicy
}

// workerFailed applies judgeFailure to a worker that failed for a reason
// other than a preemption. It reports whether the job restarted or failed.
func (d *decision) workerFailed(w *podView) bool {
	d.countFailure(w)
	msg := fmt.Sprintf("worker %s failed with exit code %d", w.pod.Name, w.exitCode)
	switch judgeFailure(d.spec, d.failures, w.exitCode) {
	case failOverBackoff:
		d.fail(etjobv1.ReasonBackoffLimit, msg+fmt.Sprintf("; %d failures exceed spec.backoffLimit (%d)", d.failures, BackoffLimit(d.spec)))
	case replaceWorker:
		d.delete(w, etjobv1.ReasonWorkerFailed)
		d.record(etjobv1.TimelineLeave, msg)
		d.event(true, etjobv1.EventWorkerFailed, msg+"; replacing it under a new name")
		return false
	case restartJob:
		d.restart(msg)
	case failByPolicy:
		d.fail(etjobv1.ReasonWorkerFailed, msg+fmt.Sprintf("; spec.workerRestartPolicy is %s and spec.restartPolicy is Never", d.spec.WorkerRestartPolicy))
	}
	return true
}

// restart restarts the whole job: every pod of this attempt goes, and the next
// attempt (a new rendezvous id) starts once they are gone.
func (d *decision) restart(msg string) {
	d.restarted = true
	for _, v := range d.all() {
		d.delete(v, etjobv1.ReasonRestarting)
	}
	d.clearMembers()
	d.record(etjobv1.TimelineRestart, msg)
	d.event(true, etjobv1.EventRestarting, fmt.Sprintf("restarting the job (restart %d): %s", d.restarts(), msg))
	d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonRestarting, msg)
	d.setCondition(etjobv1.ConditionResizing, false, etjobv1.ReasonRestarting, msg)
	d.workers = nil
}
