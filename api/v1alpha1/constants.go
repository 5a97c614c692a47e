package v1alpha1

// Condition types of an ElasticJob.
const (
	// ConditionRunning is true while minReplicas <= published members <= maxReplicas.
	ConditionRunning = "Running"
	// ConditionResizing is true while the membership is changing.
	ConditionResizing = "Resizing"
	// ConditionSuspended is true while the job is suspended by the user
	// (reason UserSuspended) or waits for capacity (reason WaitingForCapacity).
	ConditionSuspended = "Suspended"
	// ConditionComplete is true once the job succeeded.
	ConditionComplete = "Complete"
	// ConditionFailed is true once the job failed.
	ConditionFailed = "Failed"
	// ConditionCheckpointTooSlow is true while the last checkpoint took longer
	// to write than the usable notice window of a cloud the members run on.
	ConditionCheckpointTooSlow = "CheckpointTooSlow"
	// ConditionCreateRefused is true while the API server refuses to create the
	// job's pods (quota, admission); its message is the refusal.
	ConditionCreateRefused = "CreateRefused"
	// ConditionTrainingStalled is true while members' heartbeats
	// (AnnotationHeartbeat) show a member that stopped advancing while
	// others advance (reason MemberStuck) or members training in different
	// rounds or world sizes (reason Split); those members are replaced.
	ConditionTrainingStalled = "TrainingStalled"
)

// Condition reasons.
const (
	ReasonMembersReady       = "MembersReady"
	ReasonWaitingForCapacity = "WaitingForCapacity"
	ReasonUserSuspended      = "UserSuspended"
	ReasonNotSuspended       = "NotSuspended"
	ReasonScalingUp          = "ScalingUp"
	ReasonScalingDown        = "ScalingDown"
	ReasonWorkersLeaving     = "WorkersLeaving"
	ReasonStable             = "Stable"
	ReasonSucceeded          = "Succeeded"
	ReasonBackoffLimit       = "BackoffLimitExceeded"
	ReasonWorkerFailed       = "WorkerFailed"
	ReasonLauncherFailed     = "LauncherFailed"
	// ReasonInvalidLauncher: a horovod job's launcher does not run horovodrun.
	ReasonInvalidLauncher  = "InvalidLauncher"
	ReasonDeadlineExceeded = "DeadlineExceeded"
	ReasonRestarting       = "Restarting"
	ReasonFinished         = "Finished"
	ReasonPodCreateRefused = "PodCreateRefused"
	// ReasonPodTemplateInvalid: the API server refuses the job's pods as
	// invalid (422), which no retry mends: CreateRefused with this reason
	// fails the job at once, with the server's words.
	ReasonPodTemplateInvalid  = "PodTemplateInvalid"
	ReasonMemberStuck         = "MemberStuck"
	ReasonSplit               = "Split"
	ReasonTraining            = "Training"
	ReasonPodCreateAccepted   = "PodCreateAccepted"
	ReasonMaxWaitTimeExceeded = "MaxWaitTimeExceeded"
	ReasonScaleIn             = "ScaleIn"
	// ReasonGrowth: an extra worker given back (its probe timed out, or the
	// job needs fewer extra workers); a release, not a preemption.
	ReasonGrowth = "Growth"
	// ReasonPriceAboveMax: the worker's node's price rose above
	// spec.spot.maxPricePerHour; it leaves at an agreed step (a release).
	ReasonPriceAboveMax = "PriceAboveMax"
	// ReasonOverBudget: the job's workers cost more an hour than
	// spec.spot.budgetPerHour; the dearest leave at an agreed step (a
	// release).
	ReasonOverBudget = "OverBudget"
	ReasonCompleting = "Completing"
	ReasonNeverRan   = "Pending"
	// ReasonLauncherMoving: the launcher's node has a reclamation notice; the
	// workers checkpoint and stop, then the job restarts with a new launcher
	// (the rendezvous store cannot move under running workers).
	ReasonLauncherMoving = "LauncherMoving"
	// ReasonStateHandover: every member of a horovod job's horovodrun leaves
	// (or is lost) while other workers are ready to join, so no rank would
	// remain to broadcast the state to them (horovodrun's "No hosts from
	// previous set remaining"): the remaining ranks stop at an agreed step
	// and a new horovodrun resumes from that checkpoint (a release).
	ReasonStateHandover = "StateHandover"
)

// Labels, annotations and environment.
const (
	// LabelJobName names the job a pod belongs to.
	LabelJobName = "etjob.dev/job-name"
	// LabelRole is "worker" or "launcher".
	LabelRole = "etjob.dev/role"
	// LabelWorkerIndex is the worker's index.
	LabelWorkerIndex = "etjob.dev/worker-index"
	// LabelAttempt is the job's restart count when the pod was created.
	LabelAttempt = "etjob.dev/attempt"
	// LabelExtra marks an extra worker, created above spec.replicas by
	// spec.growth's Opportunistic policy, at its lower PriorityClass.
	LabelExtra = "etjob.dev/extra"
	// LabelKueueQueue is Kueue's queue label: a job that carries it does not
	// grow above spec.replicas, the size Kueue admitted.
	LabelKueueQueue = "kueue.x-k8s.io/queue-name"
	// LabelCloudProvider names a node's cloud (aws, gcp, azure, alibaba) where
	// its spec.providerID does not: etjob's local cluster sets it on process
	// nodes, whose metadata service emulates that cloud.
	LabelCloudProvider = "etjob.dev/cloud-provider"

	// RoleWorker is the worker role.
	RoleWorker = "worker"
	// RoleLauncher is the launcher role.
	RoleLauncher = "launcher"

	// AnnotationLeave on a worker pod, set by the controller to an RFC 3339
	// time, tells the worker (through its node agent) to checkpoint and leave.
	AnnotationLeave = "etjob.dev/leave"
	// AnnotationLeaveReason on a worker pod says why it was told to leave:
	// ScaleIn (not a preemption) or the notice that caused it.
	AnnotationLeaveReason = "etjob.dev/leave-reason"
	// AnnotationCheckpoint on a worker pod, set by its node agent from the
	// progress the worker reports, is the pod's last checkpoint as JSON
	// (CheckpointAnnotation). The controller publishes the newest in
	// status.lastCheckpoint.
	AnnotationCheckpoint = "etjob.dev/checkpoint"
	// AnnotationHeartbeat on a worker pod, set by its node agent from what
	// the worker library tells it with each poll (no opt-in), is the pod's
	// training heartbeat as JSON (HeartbeatAnnotation), written at most once
	// per HeartbeatInterval while the step advances and at once (at most
	// every HeartbeatMinInterval) when the world size or round changes.
	AnnotationHeartbeat = "etjob.dev/heartbeat"
	// AnnotationStopLead on a worker pod on a noticed node, set by the
	// controller with its leave annotation, is how many whole seconds before
	// the notice's deadline it stops training: until then it trains through
	// the notice (spec.spot.noticeLeadTime Train), and a deadline the cloud
	// moves moves its stop with it. Without it, it stops at the next step.
	AnnotationStopLead = "etjob.dev/stop-lead"
	// AnnotationNoticeLeadTime on a worker pod, set at its creation from
	// spec.spot.noticeLeadTime, tells its node agent to wait a moment for the
	// controller's stop time (AnnotationStopAt) on a notice instead of
	// telling it to stop at once.
	AnnotationNoticeLeadTime = "etjob.dev/notice-lead-time"
	// AnnotationScaleIn on a worker pod asks that this worker be removed first
	// on the next scale-in (set by ScaleIn requests naming instances).
	AnnotationScaleIn = "etjob.dev/scale-in"
	// AnnotationNodeNotice on a Node holds the reclamation deadline (RFC 3339);
	// the node agent sets it.
	AnnotationNodeNotice = "etjob.dev/reclaim-deadline"
	// AnnotationNodeNoticeSource on a Node says where the notice came from.
	AnnotationNodeNoticeSource = "etjob.dev/reclaim-source"
	// AnnotationNodeCheckpointRequested on a Node, set by the agent to an RFC
	// 3339 time on an early warning (AWS rebalance, GCP maintenance), asks the
	// node's workers to checkpoint now without leaving.
	AnnotationNodeCheckpointRequested = "etjob.dev/checkpoint-requested"
	// AnnotationNodeAgent on a Node ("true"), set by the node agent when it
	// starts, says that an etjob agent serves the node: its pods hear their
	// notices from the agent, and the controller does not trust a pod-level
	// notice Event about them (a rooted node's kubelet may post Events
	// about any pod; docs/security.md, N2). Virtual nodes (ECI, ACS) have no
	// agent: there the pod's Event is the notice.
	AnnotationNodeAgent = "etjob.dev/agent"
	// TaintReclaiming (NoSchedule) keeps new pods off a node that has a
	// reclamation notice; the agent sets it with the notice annotation.
	TaintReclaiming = "etjob.dev/reclaiming"

	// ExitCodePreempted is the reserved exit code of a worker that stops because
	// it was told to (EX_TEMPFAIL of sysexits.h: "try again later"). It counts as
	// a preemption, never as a failure, and it is not 0, which Horovod would take
	// for the end of the whole job.
	ExitCodePreempted = 75

	// RendezvousPort is the port of the torchrun rendezvous store in the launcher.
	RendezvousPort = 29400
)

// AutoscalerDrainTaints are the taints autoscalers put on a node they are
// about to drain and delete: cluster-autoscaler's, Karpenter v1's
// (disrupted) and v0.3x's (disruption=disrupting). The controller takes
// each for a notice without deadline of the node's pods (core.DrainSource),
// the node agent for a reclamation within its Kubernetes notice window.
var AutoscalerDrainTaints = []string{"ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted", "karpenter.sh/disruption"}

// HeartbeatAnnotation is the value of AnnotationHeartbeat (JSON).
// +kubebuilder:object:generate=false
type HeartbeatAnnotation struct {
	// Step is the worker's training step (its agreed step, or how many
	// times it asked check_alive()).
	Step int64 `json:"step"`
	// World is the world size it trains in; Round its rendezvous round
	// (torchrun) or generation (etjob.elastic).
	World int32 `json:"world"`
	Round int64 `json:"round"`
	// Since is when the agent first saw Step (RFC 3339): a member whose
	// Since grows old while others' do not has stopped advancing.
	Since string `json:"since"`
	// RoundSince is when the agent first saw this World and Round.
	RoundSince string `json:"roundSince"`
}

// CheckpointAnnotation is the value of AnnotationCheckpoint (JSON): the
// newest checkpoint of a pod, as its node agent publishes it and the
// controller reads it.
// +kubebuilder:object:generate=false
type CheckpointAnnotation struct {
	// Step is the training step the checkpoint holds.
	Step int64 `json:"step"`
	// Path is where it was written, relative to the checkpoint directory.
	Path string `json:"path"`
	// Time is when the agent heard of it (RFC 3339).
	Time string `json:"time"`
	// Seconds is how long writing it took.
	Seconds float64 `json:"seconds"`
	// SamplesPerSecond is the worker's throughput when it reported the
	// checkpoint (0 when it did not say).
	SamplesPerSecond float64 `json:"samplesPerSecond,omitempty"`
	// Workers is the number of workers SamplesPerSecond was measured with
	// (0 when it did not say): a checkpoint written at a stop reports the
	// size the job had before the change.
	Workers int32 `json:"workers,omitempty"`
}

// The types of status.timeline's events (TimelineEvent.Type).
const (
	TimelineJoin     = "Join"
	TimelineLeave    = "Leave"
	TimelineChange   = "Change"
	TimelineMove     = "Move"
	TimelineRelease  = "Release"
	TimelineRestart  = "Restart"
	TimelineResume   = "Resume"
	TimelineScale    = "Scale"
	TimelineStop     = "Stop"
	TimelineSuspend  = "Suspend"
	TimelineComplete = "Complete"
	TimelineFail     = "Fail"
	// TimelineNotice is not in status.timeline (the controller records the
	// leave a notice causes, not the notice); tools that saw the notice (the
	// demo) add it to their own timelines.
	TimelineNotice = "Notice"
)

// LeaderElectionID names the Lease the controller's replicas elect their
// leader with, in the controller's namespace (--leader-election-namespace).
const LeaderElectionID = "etjob-controller.etjob.dev"

// MaxWorkers bounds spec.replicas, minReplicas and maxReplicas (the CRD says
// so too): status.workers lists every worker pod, and in a burst of notices
// the leaving ones and their replacements at once, up to 2 x MaxWorkers
// entries of at most MaxReasonLength-character reasons and 253-character node
// names; test/integration proves such a status fits within etcd's 1.5 MiB.
const MaxWorkers = 1000

// MaxReasonLength is the longest reason status.workers[].reason carries; a
// longer one is cut, with "...".
const MaxReasonLength = 128
