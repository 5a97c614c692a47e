package core

import (
	"strconv"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Plan is what Decide wants done. The controller applies it in this order:
// deletions, signals, creations, the membership, then one status write, then
// events; the simulator applies it to its model.
type Plan struct {
	// CreateLauncher asks for the launcher pod of the current attempt.
	CreateLauncher bool
	// CreateWorkers lists the indices of new workers to create (names are
	// derived from them and never reused).
	CreateWorkers []int32
	// ExtraWorkers are the indices in CreateWorkers of extra workers, above
	// spec.replicas (spec.growth): created at its lower PriorityClass.
	ExtraWorkers []int32
	// AvoidNodes are nodes the new workers must not be scheduled on (priced
	// above spec.spot.maxPricePerHour), by name.
	AvoidNodes []string
	// Delete lists pods to delete.
	Delete []Deletion
	// Signal lists pods to tell to leave (the etjob.dev/leave annotation).
	Signal []Signal
	// Membership is the membership to publish; nil when unchanged.
	Membership *etjobv1.MembershipStatus
	// Status is the job status to write (written only if it differs).
	Status etjobv1.ElasticJobStatus
	// Events are Kubernetes Events to emit after the status write.
	Events []Event
	// RequeueAfter is the next deadline at which Decide must look again even
	// if nothing changes (a grace period, maxWaitTime, a TTL); 0 means none.
	RequeueAfter time.Duration
	// DeleteJob asks to delete the job itself (ttlSecondsAfterFinished).
	DeleteJob bool
}

// Deletion is one pod to delete and why, with what this plan's status counts
// for that pod: when the deletion fails, the pod is seen again by the next
// pass and counted again, so the controller takes these counts back out of
// the status it writes (exactly once per pod, whatever fails).
type Deletion struct {
	Name   string
	Reason string
	// Failures and Preemptions are what Status counts for this pod (0 or 1).
	Failures, Preemptions int32
}

// Signal tells one worker to checkpoint and leave from At on; a worker on a
// noticed node first trains until StopLead before its notice's deadline,
// when that is set (etjob.dev/stop-lead).
type Signal struct {
	Pod      string
	At       time.Time
	Reason   string
	StopLead time.Duration
}

// Annotations are the annotations that carry s on its pod (the leave
// signal's one writer: the controller patches them, the simulator and the
// property test set them): etjob.dev/leave, etjob.dev/leave-reason and,
// when StopLead is set, etjob.dev/stop-lead in whole seconds.
func (s Signal) Annotations() map[string]string {
	a := map[string]string{
		etjobv1.AnnotationLeave:       s.At.UTC().Format(time.RFC3339),
		etjobv1.AnnotationLeaveReason: s.Reason,
	}
	if s.StopLead > 0 {
		a[etjobv1.AnnotationStopLead] = strconv.Itoa(int(s.StopLead / time.Second))
	}
	return a
}

// Event is a Kubernetes Event about the job.
type Event struct {
	// Warning makes it a Warning Event; else it is Normal.
	Warning bool
	// Reason is one of the etjobv1.Event* reasons.
	Reason  etjobv1.EventReason
	Message string
}

// WorkerName is the name of the job's worker with the given index. Names are
// derived, deterministic and never reused within a job.
func WorkerName(job string, index int32) string {
	return job + "-worker-" + strconv.Itoa(int(index))
}

// LauncherName is the name of the job's launcher pod.
func LauncherName(job string) string { return job + "-launcher" }

// StoreSecretName is the name of the Secret with which a torchrun job's
// pods authenticate to its rendezvous store (etjobv1.StoreSecretKey).
func StoreSecretName(job string) string { return job + "-store" }
