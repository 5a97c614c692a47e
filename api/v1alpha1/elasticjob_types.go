package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Framework names the distributed training launcher an ElasticJob drives.
// +kubebuilder:validation:Enum=torchrun;horovod
type Framework string

const (
	// FrameworkTorchrun runs PyTorch elastic agents (torchrun) in every worker;
	// the launcher hosts the rendezvous store.
	FrameworkTorchrun Framework = "torchrun"
	// FrameworkHorovod runs horovodrun in the launcher with
	// --host-discovery-script /etc/edl/discover_hosts.sh.
	FrameworkHorovod Framework = "horovod"
)

// Recovery says how the job's workers recover from a membership change and
// from the loss of the launcher.
// +kubebuilder:validation:Enum=Restart;InProcess
type Recovery string

const (
	// RecoveryRestart: the workers' processes restart on a membership change
	// (torchrun's agents restart them) and a launcher lost without notice
	// restarts the whole job from its last checkpoint, counted as a failure.
	RecoveryRestart Recovery = "Restart"
	// RecoveryInProcess: the workers run etjob.elastic, recover in their own
	// processes and survive the loss of the rendezvous store: a lost or
	// noticed launcher is replaced alone, no worker restarts and no failure
	// is counted (a launcher that exits non-zero on its own still counts).
	RecoveryInProcess Recovery = "InProcess"
)

// RestartPolicy is the job-level policy applied when the job fails as a whole.
// +kubebuilder:validation:Enum=Never;OnFailure
type RestartPolicy string

const (
	// RestartPolicyNever fails the job on its first job-level failure.
	RestartPolicyNever RestartPolicy = "Never"
	// RestartPolicyOnFailure restarts the whole job, up to backoffLimit failures.
	RestartPolicyOnFailure RestartPolicy = "OnFailure"
)

// WorkerRestartPolicy says what happens when one worker fails for a reason
// that is not a preemption.
// +kubebuilder:validation:Enum=Always;OnFailure;Never;ExitCode
type WorkerRestartPolicy string

const (
	// WorkerRestartAlways replaces a failed worker under a new name.
	WorkerRestartAlways WorkerRestartPolicy = "Always"
	// WorkerRestartOnFailure replaces a failed worker under a new name. A worker
	// that exits 0 is never restarted: for torchrun that starts completion.
	WorkerRestartOnFailure WorkerRestartPolicy = "OnFailure"
	// WorkerRestartNever turns a worker failure into a job-level failure.
	WorkerRestartNever WorkerRestartPolicy = "Never"
	// WorkerRestartExitCode replaces a worker that exited with a retryable code
	// (128 or more, or killed by a signal) and turns a permanent one (1-127) into
	// a job-level failure, as Kubeflow's ExitCode policy does.
	WorkerRestartExitCode WorkerRestartPolicy = "ExitCode"
)

// CleanPodPolicy says which pods are deleted once the job has finished.
// +kubebuilder:validation:Enum=All;Running;None
type CleanPodPolicy string

const (
	// CleanPodPolicyAll deletes every pod of the job when it finishes.
	CleanPodPolicyAll CleanPodPolicy = "All"
	// CleanPodPolicyRunning deletes the pods that are still running or pending.
	CleanPodPolicyRunning CleanPodPolicy = "Running"
	// CleanPodPolicyNone keeps every pod.
	CleanPodPolicyNone CleanPodPolicy = "None"
)

// ElasticJobSpec is the desired state of an ElasticJob.
// +kubebuilder:validation:XValidation:rule="self.minReplicas <= self.replicas",message="spec.minReplicas must be less than or equal to spec.replicas",fieldPath=".minReplicas"
// +kubebuilder:validation:XValidation:rule="self.replicas <= self.maxReplicas",message="spec.replicas must be less than or equal to spec.maxReplicas",fieldPath=".replicas"
// +kubebuilder:validation:XValidation:rule="self.framework != 'horovod' || has(self.launcherTemplate)",message="spec.launcherTemplate is required when spec.framework is horovod",fieldPath=".launcherTemplate"
// +kubebuilder:validation:XValidation:rule="self.framework != 'horovod' || self.recovery != 'InProcess'",message="spec.recovery InProcess needs spec.framework torchrun (etjob.elastic workers): horovodrun runs in the launcher and cannot outlive it",fieldPath=".recovery"
// +kubebuilder:validation:XValidation:rule="!has(self.worldSizes) || size(self.worldSizes) == 0 || self.recovery == 'InProcess'",message="spec.worldSizes needs spec.recovery InProcess: etjob.elastic's ranks form only those sizes (torchrun and horovodrun have no such list)",fieldPath=".worldSizes"
type ElasticJobSpec struct {
	// replicas is the desired number of workers. `kubectl scale`, an HPA and
	// `etjob scale` write it through the /scale subresource.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// minReplicas is the fewest workers the job trains with. Below it the job
	// checkpoints, stops and waits for capacity.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	MinReplicas int32 `json:"minReplicas,omitempty"`

	// maxReplicas is the most workers the job ever runs. Arena's default is
	// 1000, which is also the bound (MaxWorkers): status.workers lists every
	// worker pod, leaving ones and their replacements at once, and the whole
	// object must stay within etcd's 1.5 MiB.
	// +kubebuilder:default=1000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	MaxReplicas int32 `json:"maxReplicas,omitempty"`

	// slotsPerWorker is the number of training processes per worker (torchrun
	// --nproc_per_node, horovod host:slots). Unset means the worker's GPU limit,
	// else 1; the value in effect is status.slotsPerWorker.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +optional
	SlotsPerWorker *int32 `json:"slotsPerWorker,omitempty"`

	// framework is the distributed launcher: torchrun or horovod.
	// +kubebuilder:default=torchrun
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.framework is immutable"
	// +optional
	Framework Framework `json:"framework,omitempty"`

	// recovery says how the workers recover: Restart (torchrun's agents
	// restart the workers' processes; a launcher lost without notice restarts
	// the job) or InProcess (the workers run etjob.elastic: they recover in
	// their own processes and outlive the rendezvous store, so a lost or
	// noticed launcher is replaced alone, without a failure or a restart).
	// +kubebuilder:default=Restart
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.recovery is immutable"
	// +optional
	Recovery Recovery `json:"recovery,omitempty"`

	// workerTemplate is the pod template of every worker. Its first container
	// runs the training command. Annotations under etjob.dev/ are etjob's.
	// +kubebuilder:validation:XValidation:rule="!has(self.metadata) || !has(self.metadata.annotations) || self.metadata.annotations.all(k, !k.startsWith('etjob.dev/'))",message="spec.workerTemplate.metadata.annotations: etjob.dev/ keys are reserved for etjob (etjob.dev/leave would stop the workers for ever)",fieldPath=".metadata.annotations"
	// +kubebuilder:validation:XValidation:rule="!has(self.metadata) || !has(self.metadata.labels) || self.metadata.labels.all(k, !k.startsWith('etjob.dev/'))",message="spec.workerTemplate.metadata.labels: etjob.dev/ keys are reserved for etjob (etjob.dev/extra would have the workers deleted and created again for ever)",fieldPath=".metadata.labels"
	WorkerTemplate corev1.PodTemplateSpec `json:"workerTemplate"`

	// launcherTemplate is the pod template of the launcher. Required for
	// horovod (it runs horovodrun). For torchrun it hosts the rendezvous store on
	// reliable capacity; when unset it defaults to the worker's first container
	// image running `python3 -m etjob.rdzv`, without GPUs. Annotations under
	// etjob.dev/ are etjob's.
	// +kubebuilder:validation:XValidation:rule="!has(self.metadata) || !has(self.metadata.annotations) || self.metadata.annotations.all(k, !k.startsWith('etjob.dev/'))",message="spec.launcherTemplate.metadata.annotations: etjob.dev/ keys are reserved for etjob (etjob.dev/leave would stop the workers for ever)",fieldPath=".metadata.annotations"
	// +kubebuilder:validation:XValidation:rule="!has(self.metadata) || !has(self.metadata.labels) || self.metadata.labels.all(k, !k.startsWith('etjob.dev/'))",message="spec.launcherTemplate.metadata.labels: etjob.dev/ keys are reserved for etjob (etjob.dev/role would make it a worker)",fieldPath=".metadata.labels"
	// +optional
	LauncherTemplate *corev1.PodTemplateSpec `json:"launcherTemplate,omitempty"`

	// maxWaitTime (whole seconds, 0 = no limit) bounds how long workers that are
	// scheduled but idle are held while the job is below minReplicas, and how
	// long a worker on a NotReady node is tolerated before it is replaced. It
	// never applies to pods merely waiting to be scheduled.
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxWaitTime int32 `json:"maxWaitTime,omitempty"`

	// restartPolicy is the job-level policy: Never fails the job on a job-level
	// failure, OnFailure restarts the whole job until backoffLimit is spent.
	// +kubebuilder:default=Never
	// +optional
	RestartPolicy RestartPolicy `json:"restartPolicy,omitempty"`

	// backoffLimit is the number of failures (preemptions excluded) the job
	// tolerates before it is marked Failed.
	// +kubebuilder:default=6
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	BackoffLimit *int32 `json:"backoffLimit,omitempty"`

	// workerRestartPolicy says what happens when one worker fails for a reason
	// other than a preemption: Always / OnFailure replace it under a new name,
	// Never fails the job, ExitCode replaces it on codes >= 128 only.
	// +kubebuilder:default=ExitCode
	// +optional
	WorkerRestartPolicy WorkerRestartPolicy `json:"workerRestartPolicy,omitempty"`

	// suspend, as in batch/v1 Job: true deletes every pod of the job and keeps
	// it until set back to false. The templates' scheduling fields may change
	// while the job is suspended (what a queue such as Kueue needs).
	// +optional
	Suspend *bool `json:"suspend,omitempty"`

	// worldSizes are the only world sizes (ranks) an etjob.elastic job
	// (recovery InProcess) trains at, such as [8, 16, 32] for a model
	// sharded 8 ways: a generation forms at the largest listed size its
	// ranks reach, the others wait as spares, and below the smallest listed
	// size that holds minReplicas workers the job stops as below min. Each
	// must be a multiple of the ranks a worker holds (slotsPerWorker); sizes
	// that are not are never formed. Empty: any whole number of workers.
	// The global batch is the script's (etjob.elastic's samplers keep it
	// whatever the world).
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Minimum=1
	// +listType=set
	// +optional
	WorldSizes []int32 `json:"worldSizes,omitempty"`

	// checkpointDir is the checkpoint directory on shared storage (a PVC mounted
	// by the worker template), exported to workers as ETJOB_CHECKPOINT_DIR.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	CheckpointDir string `json:"checkpointDir,omitempty"`

	// networkPeers are the peers, beyond the job's own pods, that may open
	// connections to the job's pods (a metrics scraper, a notebook). The
	// job's NetworkPolicy admits its own pods alone otherwise: the
	// launcher's rendezvous store, torchrun's per-round bootstrap store and
	// the gloo and NCCL ports of every worker. NetworkPolicies hold only where
	// the cluster's network plugin enforces them.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	NetworkPeers []networkingv1.NetworkPolicyPeer `json:"networkPeers,omitempty"`

	// spot configures running on spot / preemptible capacity.
	// +optional
	Spot *SpotSpec `json:"spot,omitempty"`

	// growth lets the job grow above replicas, up to maxReplicas, on capacity
	// that nobody else asks for (policy Opportunistic).
	// +optional
	Growth *GrowthSpec `json:"growth,omitempty"`

	// cleanPodPolicy says which pods are deleted when the job finishes.
	// +kubebuilder:default=Running
	// +optional
	CleanPodPolicy CleanPodPolicy `json:"cleanPodPolicy,omitempty"`

	// ttlSecondsAfterFinished deletes the job this long after it finished.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`

	// activeDeadlineSeconds fails the job this long after it started (or was
	// last resumed), as in batch/v1 Job.
	// +kubebuilder:validation:Minimum=1
	// +optional
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`
}

// SpotSpec configures how the job runs on spot / preemptible capacity.
type SpotSpec struct {
	// enabled makes workers tolerate and prefer spot nodes (Arena's
	// --spot-instance); the launcher still requires on-demand capacity.
	// +optional
	Enabled bool `json:"enabled,omitempty"`

	// preemptionReasons lists extra pod event or condition reasons that mean
	// "this pod was taken back", beyond the built-in ones (DisruptionTarget,
	// Evicted, SpotToBeReleased, evictions of ACS BestEffort pods, the etjob
	// notice annotation). The routine Events of every pod start and stop
	// (Scheduled, Pulling, Pulled, Created, Started, Killing,
	// SuccessfulAttachVolume) are not watched and cannot be reasons here.
	// +kubebuilder:validation:MaxItems=32
	// +listType=set
	// +optional
	PreemptionReasons []string `json:"preemptionReasons,omitempty"`

	// leaveGracePeriodSeconds is how long a worker told to leave is given to
	// checkpoint and exit before its pod is deleted; a worker on a node with
	// a reclamation notice keeps it until the notice's deadline when that is
	// later.
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	// +optional
	LeaveGracePeriodSeconds int32 `json:"leaveGracePeriodSeconds,omitempty"`

	// noticeLeadTime says what a worker on a node with a reclamation notice
	// does with the time left before the deadline. Train (the default) keeps
	// it training, and in the membership, until deadline - (the last
	// checkpoint's write time + stopMarginSeconds), when every rank stops at
	// one agreed step; it checkpoints once at the notice, in case the node
	// goes early. Stop stops it at the next step. A notice without a deadline
	// (a drain, a DisruptionTarget, a pod-level notice), or a job that has not
	// reported a checkpoint yet, always stops at the next step.
	// +kubebuilder:default=Train
	// +optional
	NoticeLeadTime NoticeLeadTime `json:"noticeLeadTime,omitempty"`

	// stopMarginSeconds is what a noticed worker that trains through its
	// notice keeps in hand beyond the checkpoint's write time: the step in
	// flight, the agreement on the stop step, a slower checkpoint.
	// +kubebuilder:default=15
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	// +optional
	StopMarginSeconds *int32 `json:"stopMarginSeconds,omitempty"`

	// maxPricePerHour is the most the job pays for a worker's node an hour,
	// in US dollars, as a decimal ("0.95"), read from the nodes'
	// etjob.dev/price-per-hour. New workers are kept off nodes above it; a
	// worker whose node's price rises above it leaves at an agreed step, as
	// on a notice, and is replaced elsewhere. Unset: no limit.
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
	// +kubebuilder:validation:MaxLength=32
	// +optional
	MaxPricePerHour string `json:"maxPricePerHour,omitempty"`

	// budgetPerHour is the most the job's workers cost together an hour, in
	// US dollars, as a decimal ("12.50"), at their nodes'
	// etjob.dev/price-per-hour (a node without it costs 0 here). New workers
	// are not started above it: no more are created than the budget left
	// buys at the cheapest priced node, and each is kept off nodes dearer
	// than its share of what is left. When prices rise above it, the dearest
	// workers leave at an agreed step, as on a notice, and may be replaced
	// on cheaper nodes. Unset: no budget.
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
	// +kubebuilder:validation:MaxLength=32
	// +optional
	BudgetPerHour string `json:"budgetPerHour,omitempty"`
}

// GrowthPolicy says how far a job grows.
// +kubebuilder:validation:Enum=Replicas;Opportunistic
type GrowthPolicy string

const (
	// GrowthReplicas grows the job back to spec.replicas only.
	GrowthReplicas GrowthPolicy = "Replicas"
	// GrowthOpportunistic aims for spec.replicas and adds extra workers, up
	// to spec.maxReplicas, while they are scheduled on free capacity.
	GrowthOpportunistic GrowthPolicy = "Opportunistic"
)

// DefaultGrowthPriorityClass is the PriorityClass of extra workers that the
// chart ships: below every workload's default (0), never preempting.
const DefaultGrowthPriorityClass = "etjob-opportunistic"

// GrowthSpec configures growth above spec.replicas.
type GrowthSpec struct {
	// policy: Replicas (the default) grows back to spec.replicas only;
	// Opportunistic adds extra workers while they are scheduled on free
	// capacity. Extra workers run at priorityClassName, so the scheduler
	// preempts them first for any other pod, and the job lets them go at an
	// agreed step (a planned leave, never a failure). A job queued by Kueue
	// (label kueue.x-k8s.io/queue-name) does not grow above what was
	// admitted, spec.replicas.
	// +kubebuilder:default=Replicas
	// +optional
	Policy GrowthPolicy `json:"policy,omitempty"`

	// priorityClassName is the PriorityClass of extra workers; the chart ships
	// etjob-opportunistic (value -10, preemptionPolicy Never).
	// +kubebuilder:default=etjob-opportunistic
	// +kubebuilder:validation:MaxLength=253
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// probeTimeoutSeconds: an extra worker that is not scheduled this long
	// after its creation is given up (deleted).
	// +kubebuilder:default=120
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	// +optional
	ProbeTimeoutSeconds int32 `json:"probeTimeoutSeconds,omitempty"`

	// backoffSeconds: after a probe was given up, or an extra worker was taken
	// back, no new extra worker is created for this long.
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	// +optional
	BackoffSeconds int32 `json:"backoffSeconds,omitempty"`

	// minSamplesPerSecondPerWorker stops growth when the job's measured
	// throughput (the samplesPerSecond the workers report with their
	// checkpoints) gained less than this per added worker; 0 turns the rule
	// off.
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinSamplesPerSecondPerWorker int64 `json:"minSamplesPerSecondPerWorker,omitempty"`
}

// NoticeLeadTime is what a noticed worker does with the time before the
// notice's deadline.
// +kubebuilder:validation:Enum=Train;Stop
type NoticeLeadTime string

const (
	// NoticeLeadTimeTrain trains until the deadline less the checkpoint time
	// and the margin, then stops at an agreed step.
	NoticeLeadTimeTrain NoticeLeadTime = "Train"
	// NoticeLeadTimeStop stops at the next step after the notice.
	NoticeLeadTimeStop NoticeLeadTime = "Stop"
)

// WorkerState is the state of one worker as the controller sees it.
type WorkerState string

const (
	// WorkerPending waits to be scheduled or to start.
	WorkerPending WorkerState = "Pending"
	// WorkerStarting runs but is not ready yet.
	WorkerStarting WorkerState = "Starting"
	// WorkerMember is ready and in the published membership.
	WorkerMember WorkerState = "Member"
	// WorkerReady is ready but not (yet) in the published membership.
	WorkerReady WorkerState = "Ready"
	// WorkerLeaving was told to leave (node notice, scale-in, suspend).
	WorkerLeaving WorkerState = "Leaving"
	// WorkerSucceeded exited 0.
	WorkerSucceeded WorkerState = "Succeeded"
	// WorkerFailed failed for a reason other than a preemption.
	WorkerFailed WorkerState = "Failed"
	// WorkerPreempted was taken back (notice, eviction, node loss, graceful exit).
	WorkerPreempted WorkerState = "Preempted"
)

// WorkerStatus is one worker in status.workers.
type WorkerStatus struct {
	// name is the pod name; never reused within a job.
	Name string `json:"name"`
	// index is the worker's index, part of its name.
	Index int32 `json:"index"`
	// state is the worker's state.
	State WorkerState `json:"state"`
	// node is the node the worker runs on, if scheduled.
	// +optional
	Node string `json:"node,omitempty"`
	// reason says why the worker is in its state, when that is not obvious.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// MembershipStatus is the membership the controller published.
type MembershipStatus struct {
	// generation grows by one with every published change; it never goes back.
	Generation int64 `json:"generation"`
	// hosts are the published members, as horovod's `host:slots` lines print them.
	// +optional
	Hosts []string `json:"hosts,omitempty"`
	// changeTime is when the membership last changed.
	// +optional
	ChangeTime *metav1.Time `json:"changeTime,omitempty"`
}

// CheckpointStatus is the last checkpoint the workers reported.
type CheckpointStatus struct {
	// step is the training step the checkpoint holds.
	Step int64 `json:"step"`
	// path is the checkpoint file, relative to spec.checkpointDir.
	// +optional
	Path string `json:"path,omitempty"`
	// time is when the checkpoint was written.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
	// durationMilliseconds is how long writing it took.
	// +optional
	DurationMilliseconds int64 `json:"durationMilliseconds,omitempty"`
}

// TimelineEvent is one entry of the job's bounded membership timeline.
type TimelineEvent struct {
	// time is when it happened.
	Time metav1.Time `json:"time"`
	// type is Join, Leave, Change, Move, Release, Stop, Suspend, Resume,
	// Restart, Scale, Complete or Fail.
	Type string `json:"type"`
	// generation is the membership generation after the event.
	Generation int64 `json:"generation"`
	// members is the number of published members after the event.
	Members int32 `json:"members"`
	// message says what happened.
	// +optional
	Message string `json:"message,omitempty"`
}

// GrowthStatus is the state of growth above spec.replicas.
type GrowthStatus struct {
	// extraWorkers is the number of extra workers above spec.replicas that
	// are not leaving.
	// +optional
	ExtraWorkers int32 `json:"extraWorkers,omitempty"`
	// limit is the most workers growth aims for now.
	// +optional
	Limit int32 `json:"limit,omitempty"`
	// reason says what holds growth at limit: MaxReplicas, Admitted (a Kueue
	// job), Throughput, Backoff, Probing or Replicas (the base workers come
	// first).
	// +optional
	Reason string `json:"reason,omitempty"`
	// backoffUntil: no extra worker is created before this time.
	// +optional
	BackoffUntil *metav1.Time `json:"backoffUntil,omitempty"`
	// throughput is the job's measured throughput at each size it ran at
	// (from the workers' checkpoints), smallest size first.
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	Throughput []ThroughputPoint `json:"throughput,omitempty"`
}

// ThroughputPoint is the job's throughput at one size.
type ThroughputPoint struct {
	// workers is the number of members.
	Workers int32 `json:"workers"`
	// samplesPerSecond is the members' reported throughput together, in
	// whole samples a second.
	SamplesPerSecond int64 `json:"samplesPerSecond"`
}

// CostStatus is the job's bill, kept by the controller: the worker hours of
// every worker pod the job ever ran (also the deleted ones), by capacity type
// and price, and what those hours cost on demand.
type CostStatus struct {
	// time: the bill covers the job's worker pods up to this time (to the
	// microsecond: the next update starts exactly there). The controller
	// brings it up to date with every status write and at least every 5
	// minutes while a worker runs.
	// +optional
	Time *metav1.MicroTime `json:"time,omitempty"`
	// rows are the worker hours by capacity type and price.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	Rows []CostRow `json:"rows,omitempty"`
	// workerHours is the rows' hours together, as a decimal.
	// +optional
	WorkerHours string `json:"workerHours,omitempty"`
	// cost is the rows' cost together, in US dollars, as a decimal.
	// +optional
	Cost string `json:"cost,omitempty"`
	// onDemandCost is what the same hours cost at the on-demand price of the
	// same instance types, in US dollars ("" where no on-demand price is
	// known for some of them).
	// +optional
	OnDemandCost string `json:"onDemandCost,omitempty"`
}

// CostRow is the worker time at one capacity type and price.
type CostRow struct {
	// capacityType is the nodes' karpenter.sh/capacity-type: spot,
	// on-demand, or "" when unknown.
	// +optional
	CapacityType string `json:"capacityType,omitempty"`
	// instanceType is the nodes' node.kubernetes.io/instance-type.
	// +optional
	InstanceType string `json:"instanceType,omitempty"`
	// pricePerHour is the nodes' etjob.dev/price-per-hour ("" when unknown).
	// +optional
	PricePerHour string `json:"pricePerHour,omitempty"`
	// onDemandPricePerHour is the on-demand price of that instance type
	// ("" when unknown).
	// +optional
	OnDemandPricePerHour string `json:"onDemandPricePerHour,omitempty"`
	// milliseconds is the worker time, summed over pods.
	Milliseconds int64 `json:"milliseconds"`
}

// ElasticJobStatus is the observed state of an ElasticJob.
type ElasticJobStatus struct {
	// conditions: Running, Resizing, Suspended, Complete, Failed, with reasons.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the spec generation this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// summary is the one-word state shown by `kubectl get`; the truth is in
	// conditions.
	// +optional
	Summary string `json:"summary,omitempty"`

	// replicas is the number of worker pods that are not leaving or finished
	// (the /scale subresource's status.replicas).
	Replicas int32 `json:"replicas,omitempty"`
	// readyReplicas is the number of ready workers that are not leaving.
	ReadyReplicas int32 `json:"readyReplicas"`
	// members is the number of published members (worker pods).
	Members int32 `json:"members"`
	// ranks is the training processes of the published members: members
	// times slotsPerWorker (a pod may hold several ranks, which leave and
	// join together).
	// +optional
	Ranks int32 `json:"ranks,omitempty"`
	// training is the number of members whose heartbeat (the worker
	// library's, through its node agent) advanced within the last
	// HeartbeatStale; unset while no member reports one (a script that
	// does not use etjob's worker library).
	// +optional
	Training *int32 `json:"training,omitempty"`
	// leavingReplicas is the number of workers told to leave.
	// +optional
	LeavingReplicas int32 `json:"leavingReplicas,omitempty"`
	// desired is "replicas (min-max)", shown by `kubectl get`.
	// +optional
	Desired string `json:"desired,omitempty"`
	// selector selects the job's worker pods (for /scale and HPAs).
	// +optional
	Selector string `json:"selector,omitempty"`

	// slotsPerWorker is the value in effect: spec.slotsPerWorker, else the
	// worker's GPU limit, else 1.
	// +optional
	SlotsPerWorker int32 `json:"slotsPerWorker,omitempty"`

	// workers lists every worker pod of the current attempt.
	// +listType=map
	// +listMapKey=name
	// +optional
	Workers []WorkerStatus `json:"workers,omitempty"`

	// membership is the published membership.
	// +optional
	Membership MembershipStatus `json:"membership,omitempty"`

	// nextWorkerIndex is the index the next new worker gets; indices (and so
	// names) are never reused, because Horovod blacklists failed hosts by name.
	// +optional
	NextWorkerIndex int32 `json:"nextWorkerIndex,omitempty"`

	// restarts counts whole-job restarts.
	// +optional
	Restarts int32 `json:"restarts,omitempty"`
	// failures counts failures that spend backoffLimit (preemptions never do).
	// +optional
	Failures int32 `json:"failures,omitempty"`
	// preemptions counts workers and launchers taken back by their capacity.
	// +optional
	Preemptions int32 `json:"preemptions,omitempty"`
	// launcherReplacements counts the launchers of this attempt that were
	// replaced while the workers trained on (spec.recovery InProcess); a
	// restart sets it back to 0. The launcher gets it as
	// ETJOB_RDZV_REPLACEMENT: a replacement's store tells the workers that
	// it is not the attempt's first.
	// +optional
	LauncherReplacements int32 `json:"launcherReplacements,omitempty"`

	// lastCheckpoint is the last checkpoint the workers reported.
	// +optional
	LastCheckpoint *CheckpointStatus `json:"lastCheckpoint,omitempty"`

	// cost is the job's bill: worker hours and cost by capacity type and
	// price, next to the on-demand equivalent.
	// +optional
	Cost *CostStatus `json:"cost,omitempty"`

	// growth is the state of growth above spec.replicas (spec.growth).
	// +optional
	Growth *GrowthStatus `json:"growth,omitempty"`

	// timeline is a bounded history of membership events (newest last).
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Timeline []TimelineEvent `json:"timeline,omitempty"`

	// startTime is when the job started, or was last resumed.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// belowMinSince is when the job last fell below minReplicas members.
	// +optional
	BelowMinSince *metav1.Time `json:"belowMinSince,omitempty"`
	// completionTime is when the job finished (Complete or Failed).
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// ElasticJob is an elastic distributed training job that keeps training while
// nodes come and go, checkpoints on reclamation notices, shrinks, suspends and
// resumes.
// Its name names the pods (<name>-worker-<index>, <name>-launcher), the
// headless Service and the pods' subdomain: a DNS label of at most 45
// characters (a worker's name stays a DNS label for any index).
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS label (lower-case letters, digits and '-', starting with a letter): it names the job's Service and pods"
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 45",message="metadata.name must be at most 45 characters: the worker pods are named <name>-worker-<index> and stay DNS labels (63)"
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=etjob;ej,categories=all
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Desired",type=string,JSONPath=`.status.desired`
// +kubebuilder:printcolumn:name="Ranks",type=integer,JSONPath=`.status.ranks`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.summary`
// +kubebuilder:printcolumn:name="Restarts",type=integer,JSONPath=`.status.restarts`
// +kubebuilder:printcolumn:name="Preemptions",type=integer,JSONPath=`.status.preemptions`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ElasticJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ElasticJobSpec   `json:"spec,omitempty"`
	Status ElasticJobStatus `json:"status,omitempty"`
}

// MaxNameLength is the longest ElasticJob name: room in a 63-character pod
// hostname for "-worker-" and a ten-digit worker index (indices are never
// reused). The CRD's rule on metadata.name says the same number; the
// validation test checks both ends.
const MaxNameLength = 45

// ElasticJobList is a list of ElasticJobs.
// +kubebuilder:object:root=true
type ElasticJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ElasticJob `json:"items"`
}
