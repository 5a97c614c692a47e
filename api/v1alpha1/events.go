package v1alpha1

// EventReason is the reason of a Kubernetes Event the controller emits about
// an ElasticJob (what `kubectl describe etjob` shows). Where an Event reports
// a condition, its reason is the condition's reason.
type EventReason string

// Event reasons of an ElasticJob.
const (
	// EventCompleted (Normal): the job succeeded.
	EventCompleted EventReason = "Completed"
	// EventFailed (Warning): the job failed; the message says why.
	EventFailed EventReason = "Failed"
	// EventSuspended (Normal): spec.suspend released every pod.
	EventSuspended EventReason = "Suspended"
	// EventResumed (Normal): the job resumed after spec.suspend, or capacity
	// returned after it waited below spec.minReplicas.
	EventResumed EventReason = "Resumed"
	// EventRestarting (Warning): the whole job restarts under a new attempt.
	EventRestarting EventReason = ReasonRestarting
	// EventPreempted (Normal): a worker was preempted; not counted as a failure.
	EventPreempted EventReason = "Preempted"
	// EventWorkerFailed (Warning): a worker failed and is replaced under a new name.
	EventWorkerFailed EventReason = ReasonWorkerFailed
	// EventLauncherMoving (Normal): the launcher's node has a reclamation
	// notice; the workers checkpoint and stop, then the job restarts.
	EventLauncherMoving EventReason = ReasonLauncherMoving
	// EventLauncherReplaced (Normal, Warning when counted as a failure): the
	// launcher of a spec.recovery InProcess job was lost or noticed and is
	// replaced alone; the workers train on.
	EventLauncherReplaced EventReason = "LauncherReplaced"
	// EventMembershipChanged (Normal): a new membership generation was published.
	EventMembershipChanged EventReason = "MembershipChanged"
	// EventWaitingForCapacity (Warning): the job fell below spec.minReplicas
	// members and waits for capacity.
	EventWaitingForCapacity EventReason = ReasonWaitingForCapacity
	// EventMaxWaitTimeExceeded (Warning): the job stayed below
	// spec.minReplicas for spec.maxWaitTime and released its idle workers.
	EventMaxWaitTimeExceeded EventReason = ReasonMaxWaitTimeExceeded
	// EventMemberStuck (Warning): a member's heartbeat stopped advancing
	// while the others' advance; it is replaced.
	EventMemberStuck EventReason = ReasonMemberStuck
	// EventSplit (Warning): members train in different rounds or world sizes;
	// those outside the largest world are replaced.
	EventSplit EventReason = ReasonSplit
	// EventCheckpointTooSlow (Warning): the last checkpoint took longer than
	// the notice window of a cloud the members run on.
	EventCheckpointTooSlow EventReason = ConditionCheckpointTooSlow
	// EventStateHandover (Normal): no member of a horovod job's horovodrun
	// stays while others are ready to join: the job stops at an agreed step
	// and a new horovodrun resumes from its checkpoint with the new workers.
	EventStateHandover EventReason = ReasonStateHandover
)
