package core

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Snapshot is everything Decide looks at: the job (spec and the bookkeeping it
// keeps in status), its pods of every attempt, and the nodes those pods are on.
type Snapshot struct {
	// Job is the ElasticJob as last read. Decide never modifies it.
	Job *etjobv1.ElasticJob
	// Pods are the job's pods (workers and launcher, any attempt).
	Pods []*corev1.Pod
	// Nodes are the nodes known to the cluster, by name: at least those of
	// the job's pods, and, for a job with spec.spot.maxPricePerHour, every
	// node priced above it; for one with spec.spot.budgetPerHour, every
	// priced node. A pod bound to a node missing from this map has lost its
	// node.
	Nodes map[string]*corev1.Node
	// PodNotices are pod-level reclamation notices, by pod name: the reason of
	// an Event on the pod (its UID) for which NoticeEvent holds (ECI's
	// SpotToBeReleased, an ACS BestEffort revocation), for pods on nodes
	// that no etjob agent serves (TrustPodNotices). Serverless pods have no
	// node agent, so this is the only notice they get.
	PodNotices map[string]string
	// Prices is the platform admin's price table (etjobv1.PriceTable), nil
	// when there is none: then every node's own price is trusted.
	Prices *etjobv1.PriceTable `json:",omitempty"`
}

// noticeEventReasons are the Event reasons that announce the reclamation of
// one pod: Alibaba ECI emits SpotToBeReleased on a spot pod ~3 minutes before
// it is released.
var noticeEventReasons = map[string]bool{"SpotToBeReleased": true}

// evictionEventReasons announce an eviction; on an ACS BestEffort pod
// (label alibabacloud.com/compute-qos: best-effort) they are its revocation
// notice, ~5 minutes ahead.
var evictionEventReasons = map[string]bool{"Evicting": true, "Evicted": true, "Preempting": true, "Preempted": true}

// BestEffortQoSLabel marks an ACS pod of the BestEffort compute QoS, which the
// platform may revoke with an eviction notice.
const BestEffortQoSLabel = "alibabacloud.com/compute-qos"

// TrustPodNotices reports whether pod-level notice Events (NoticeEvent) are
// trusted for the pods bound to node: only where no etjob agent serves it
// (etjobv1.AnnotationNodeAgent), as on ECI and ACS virtual nodes, whose
// platform posts the Event and where it is the only notice. Where an agent
// serves the node, its pods hear their notices from the agent, and an Event
// about them is not trusted: any kubelet may post Events about any pod, so a
// rooted node could otherwise make every worker in the cluster leave again
// and again (docs/security.md, N2). A pod not yet bound (node nil) has no
// notice to hear.
func TrustPodNotices(node *corev1.Node) bool {
	return node != nil && node.Annotations[etjobv1.AnnotationNodeAgent] == ""
}

// PodNoticeEvent reports whether ev is a reclamation notice for the job's
// worker bound to node: an Event that names the pod's own UID (an Event with
// none, or an earlier pod's, says nothing of this one), on a node whose pod
// notices are trusted (TrustPodNotices), with a reason NoticeEvent accepts.
// A launcher hears no pod-level notice (issue #42, M2): it runs on on-demand
// capacity, which no platform reclaims with a notice, and a move restarts
// every worker of the job, so an Event about it, which any kubelet may post,
// is not one; the notices of its node reach it through the node's agent.
// Nor is an Event whose source names another node of the cluster (isNode)
// than the pod's: the chart's admission policy makes a kubelet name its own
// node there, so a rooted kubelet can give notices only to the pods it
// could kill anyway (issue #42, M2); a platform's Event that names no node,
// or something else (an instance), is taken.
func PodNoticeEvent(job *etjobv1.ElasticJob, pod *corev1.Pod, node *corev1.Node, ev *corev1.Event, isNode func(name string) bool) bool {
	return ev.InvolvedObject.UID == pod.UID && pod.Labels[etjobv1.LabelRole] != etjobv1.RoleLauncher &&
		TrustPodNotices(node) && NoticeEvent(job, pod, ev.Reason) && !fromOtherNode(ev, pod.Spec.NodeName, isNode)
}

// fromOtherNode reports whether ev's source (its host, or the reporting
// instance of the events.k8s.io API) names a node other than nodeName.
func fromOtherNode(ev *corev1.Event, nodeName string, isNode func(string) bool) bool {
	for _, h := range []string{ev.Source.Host, ev.ReportingInstance} {
		if h != "" && h != nodeName && isNode(h) {
			return true
		}
	}
	return false
}

// NoticeEvent reports whether an Event with the given reason on the job's pod
// is a reclamation notice for that pod: ECI's SpotToBeReleased, an eviction
// Event on an ACS BestEffort pod, or a reason listed in
// spec.spot.preemptionReasons.
func NoticeEvent(job *etjobv1.ElasticJob, pod *corev1.Pod, reason string) bool {
	if noticeEventReasons[reason] {
		return true
	}
	if pod != nil && pod.Labels[BestEffortQoSLabel] == "best-effort" && evictionEventReasons[reason] {
		return true
	}
	return job.Spec.Spot != nil && slices.Contains(job.Spec.Spot.PreemptionReasons, reason)
}

// Tunables of the decision core that are not part of the API.
const (
	// MaxCreatesPerPass bounds the pods created by one Decide, as kube's Job
	// controller bounds its batches, so a large job ramps up without a burst
	// and one reconcile stays short: the controller's client makes 50
	// requests a second for 4 reconciles at once, so 8 creates take about
	// 0.6 s when every reconcile creates, and the job is queued again behind
	// the others in between (docs/benchmarks.md: reconcile p99 at 1,000 jobs).
	// A scale-out by up to 8 is still one pass.
	MaxCreatesPerPass = 8
	// CompletionGracePeriod is how long the other members are given to exit 0
	// after the first torchrun member did, before the job is declared complete.
	CompletionGracePeriod = 60 * time.Second
	// TimelineLimit bounds status.timeline.
	TimelineLimit = 64
	// JoinBatchWindow: while a running job has other workers bound to nodes
	// and starting, a newly ready worker waits up to this long to join the
	// membership with them: one membership change per scale-out (one status
	// write, plus the ConfigMap for horovod; one restart of the workers) instead of one
	// per worker (issue #6's 2k+3 writes; the trace simulator's join restarts).
	JoinBatchWindow = 5 * time.Second
	// NoticeJoinHold: a newly ready worker waits up to this long for a
	// member training through its notice to stop, and joins in the same
	// membership change (one checkpoint and restart instead of two). A
	// restart of the whole group costs more worker-time than one worker
	// idle meanwhile (make sim: docs/benchmarks.md).
	NoticeJoinHold = 2 * time.Minute
)

// BackoffLimit returns spec.backoffLimit, 6 (Arena's and batch/v1 Job's
// default) when unset.
func BackoffLimit(spec *etjobv1.ElasticJobSpec) int32 {
	if spec.BackoffLimit != nil {
		return *spec.BackoffLimit
	}
	return 6
}

// podView is what Decide derives from one pod: its role and attempt, and the
// classification that every later decision uses.
type podView struct {
	pod      *corev1.Pod
	role     string
	index    int32
	attempt  int32
	deleting bool
	// terminal: the pod's phase is Succeeded or Failed.
	terminal  bool
	succeeded bool
	exitCode  int32 // of the first container; -1 when unknown
	// message is the first container's termination message (the end of its
	// log under FallbackToLogsOnError).
	message string
	ready   bool
	// readySince: when it became Ready (zero if not Ready or unknown).
	readySince time.Time
	scheduled  bool
	// preempted: terminal for a reason that is not the workload's fault.
	preempted     bool
	preemptReason string
	// released: terminal after being told to leave by the job's own decision
	// (isRelease): neither a failure nor a preemption.
	released bool
	// lost: not terminal, but its node is gone (or NotReady too long).
	lost       bool
	lostReason string
	// noticed: its node carries a reclamation notice.
	noticed      bool
	noticeReason string
	// noticeDeadline: when the noticed node goes (zero if unknown).
	noticeDeadline time.Time
	// leaveAt: when the controller told it to leave (zero if never), and why.
	leaveAt     time.Time
	leaveReason string
	// stopLead: how long before its notice's deadline a worker on a noticed
	// node stops training (etjob.dev/stop-lead; 0: at once).
	stopLead time.Duration
	// scaleIn: named by a ScaleIn request.
	scaleIn bool
	// extra: created above spec.replicas by spec.growth (etjob.dev/extra).
	extra bool
	// finishedAt: when its first container terminated (zero if unknown).
	finishedAt time.Time
	// notReadySince: when its node became NotReady (zero if Ready).
	notReadySince time.Time
	// checkpoint: the last checkpoint its node agent published (nil if none).
	checkpoint *etjobv1.CheckpointAnnotation
	// heartbeat: the training heartbeat its node agent published (nil if
	// none: heartbeat.go).
	heartbeat *heartbeat
	// provider: the cloud of its node ("" if unknown).
	provider string
}

func (v *podView) leaving() bool { return v.noticed || !v.leaveAt.IsZero() }

// active: counts toward the desired size: alive, not going away.
func (v *podView) active() bool {
	return !v.deleting && !v.terminal && !v.lost && !v.leaving()
}

// preemptionReasons are the pod status reasons and condition types that mean
// "the capacity was taken back" (Kubernetes Job's pod failure policy and
// Alibaba's serverless notices are the model).
var preemptionReasons = map[string]bool{
	"Evicted":                       true,
	"Preempting":                    true,
	"NodeLost":                      true,
	"NodeShutdown":                  true,
	"Shutdown":                      true,
	"Terminated":                    true,
	"DeletionByPodGC":               true,
	"SpotToBeReleased":              true,
	"PreemptionByScheduler":         true,
	"TerminationByKubelet":          true,
	"EvictionByEvictionAPI":         true,
	"DeletionByTaintManager":        true,
	string(corev1.DisruptionTarget): true,
}

func classify(s *Snapshot, pod *corev1.Pod) *podView {
	v := &podView{pod: pod, exitCode: -1}
	v.role = pod.Labels[etjobv1.LabelRole]
	if i, err := strconv.ParseInt(pod.Labels[etjobv1.LabelWorkerIndex], 10, 32); err == nil {
		v.index = int32(i)
	}
	if a, err := strconv.ParseInt(pod.Labels[etjobv1.LabelAttempt], 10, 32); err == nil {
		v.attempt = int32(a)
	}
	v.deleting = pod.DeletionTimestamp != nil
	v.terminal = pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	v.succeeded = pod.Status.Phase == corev1.PodSucceeded
	v.scheduled = pod.Spec.NodeName != ""
	if len(pod.Status.ContainerStatuses) > 0 {
		cs := pod.Status.ContainerStatuses[0]
		if t := cs.State.Terminated; t != nil {
			v.exitCode, v.message = t.ExitCode, t.Message
			v.finishedAt = t.FinishedAt.Time
		} else if t := cs.LastTerminationState.Terminated; t != nil && v.terminal {
			v.exitCode, v.message = t.ExitCode, t.Message
			v.finishedAt = t.FinishedAt.Time
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			v.ready = pod.Status.Phase == corev1.PodRunning
			v.readySince = c.LastTransitionTime.Time
		}
	}
	if t, err := time.Parse(time.RFC3339, pod.Annotations[etjobv1.AnnotationLeave]); err == nil {
		v.leaveAt = t
		v.leaveReason = pod.Annotations[etjobv1.AnnotationLeaveReason]
	}
	if n, err := strconv.ParseInt(pod.Annotations[etjobv1.AnnotationStopLead], 10, 32); err == nil && n > 0 {
		v.stopLead = time.Duration(n) * time.Second
	}
	_, v.scaleIn = pod.Annotations[etjobv1.AnnotationScaleIn]
	v.extra = pod.Labels[etjobv1.LabelExtra] == "true"
	v.heartbeat = parseHeartbeat(pod.Annotations[etjobv1.AnnotationHeartbeat])
	if raw := pod.Annotations[etjobv1.AnnotationCheckpoint]; raw != "" {
		c := &etjobv1.CheckpointAnnotation{}
		if json.Unmarshal([]byte(raw), c) == nil && c.Step > 0 {
			v.checkpoint = c
		}
	}

	var extra map[string]bool
	if sp := s.Job.Spec.Spot; sp != nil && len(sp.PreemptionReasons) > 0 {
		extra = make(map[string]bool, len(sp.PreemptionReasons))
		for _, r := range sp.PreemptionReasons {
			extra[r] = true
		}
	}
	isPreemptionReason := func(r string) bool { return preemptionReasons[r] || extra[r] }

	if v.scheduled {
		node, ok := s.Nodes[pod.Spec.NodeName]
		switch {
		case !ok:
			v.lost, v.lostReason = true, "NodeLost"
		default:
			v.provider = nodeProvider(node)
			if d := node.Annotations[etjobv1.AnnotationNodeNotice]; d != "" {
				v.noticed = true
				if t, err := time.Parse(time.RFC3339, d); err == nil {
					v.noticeDeadline = t
				}
				v.noticeReason = "ReclaimNotice"
				if src := node.Annotations[etjobv1.AnnotationNodeNoticeSource]; src != "" {
					v.noticeReason = "ReclaimNotice(" + src + ")"
				}
			}
			if src := DrainSource(node); src != "" && !v.noticed {
				// A drain, an upgrade or a consolidation: no deadline,
				// so the pod leaves at the next agreed step (the job's
				// disruption budget holds the eviction until then).
				v.noticed, v.noticeReason = true, "NodeDrain("+src+")"
			}
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
					v.notReadySince = c.LastTransitionTime.Time
				}
			}
		}
	}

	if r := s.PodNotices[pod.Name]; r != "" && !v.noticed {
		v.noticed, v.noticeReason = true, "PodNotice("+r+")"
	}

	if v.terminal && !v.succeeded {
		switch {
		case !v.leaveAt.IsZero() && isRelease(v.leaveReason) && !v.noticed:
			v.released = true
		case v.exitCode == etjobv1.ExitCodePreempted:
			v.preempted, v.preemptReason = true, "GracefulExit"
		case v.noticed:
			v.preempted, v.preemptReason = true, v.noticeReason
		case !v.leaveAt.IsZero() && !isRelease(v.leaveReason):
			v.preempted, v.preemptReason = true, "LeftAfterSignal"
		case v.lost:
			v.preempted, v.preemptReason = true, v.lostReason
		case isPreemptionReason(pod.Status.Reason):
			v.preempted, v.preemptReason = true, pod.Status.Reason
		}
		if !v.preempted && !v.released {
			for _, c := range pod.Status.Conditions {
				if c.Status == corev1.ConditionTrue && isPreemptionReason(string(c.Type)) {
					v.preempted, v.preemptReason = true, string(c.Type)
				}
			}
		}
	}
	if !v.terminal {
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
				v.noticed, v.noticeReason = true, "DisruptionTarget"
			}
		}
	}
	return v
}

// DrainSource reports what says that node is being drained (a voluntary
// disruption: kubectl drain, an upgrade, an autoscaler consolidating): its
// cordon (spec.unschedulable, the taint's key) or an autoscaler's taint; ""
// when nothing does. Every pod on such a node is noticed with no deadline:
// it leaves at the job's next agreed step.
func DrainSource(node *corev1.Node) string {
	if node == nil {
		return ""
	}
	for _, key := range etjobv1.AutoscalerDrainTaints {
		for _, t := range node.Spec.Taints {
			if t.Key == key {
				return key
			}
		}
	}
	if node.Spec.Unschedulable {
		return corev1.TaintNodeUnschedulable
	}
	return ""
}

// NoticeWindow is a cloud's reclamation notice: how long before its node goes
// it comes, and how much of that the node's pods get.
type NoticeWindow struct {
	Window, Usable time.Duration
}

// Reserve is how long before the notice's deadline the cloud takes the
// node's pods.
func (w NoticeWindow) Reserve() time.Duration { return w.Window - w.Usable }

// NoticeWindows are the clouds' documented notices: Alibaba ~5 min, AWS 2
// min, Azure at least 30 s, GCP 30 s of which GKE pods get ~15 s.
var NoticeWindows = map[string]NoticeWindow{
	"alibaba": {Window: 300 * time.Second, Usable: 300 * time.Second},
	"aws":     {Window: 120 * time.Second, Usable: 120 * time.Second},
	"azure":   {Window: 30 * time.Second, Usable: 30 * time.Second},
	"gcp":     {Window: 30 * time.Second, Usable: 15 * time.Second},
}

// nodeProvider names a node's cloud from its providerID (aws://, gce://,
// azure://, alicloud://) or, on etjob's local cluster, its
// etjob.dev/cloud-provider label.
func nodeProvider(n *corev1.Node) string {
	id := n.Spec.ProviderID
	switch {
	case strings.HasPrefix(id, "aws://"):
		return "aws"
	case strings.HasPrefix(id, "gce://"):
		return "gcp"
	case strings.HasPrefix(id, "azure://"):
		return "azure"
	case strings.HasPrefix(id, "alicloud://"), strings.HasPrefix(id, "alibaba://"):
		return "alibaba"
	}
	return n.Labels[etjobv1.LabelCloudProvider]
}

// isRelease reports whether a leave reason is the job's own decision (a
// scale-in, stopping every worker to wait for capacity below min, an extra
// worker given back, a node priced above spec.spot.maxPricePerHour, the
// dearest worker over spec.spot.budgetPerHour, a horovod job's stop when no
// host of horovodrun's set would stay): a worker
// that leaves for it is neither a failure nor a preemption.
func isRelease(reason string) bool {
	switch reason {
	case etjobv1.ReasonScaleIn, etjobv1.ReasonWaitingForCapacity, etjobv1.ReasonGrowth, etjobv1.ReasonPriceAboveMax, etjobv1.ReasonOverBudget,
		etjobv1.ReasonStateHandover:
		return true
	}
	return false
}

// retryableExit reports whether an exit code is retryable under the ExitCode
// worker restart policy: 128 and above (killed by a signal, or the container
// runtime's own codes) are, 1-127 (the program's own errors) are not.
func retryableExit(code int32) bool { return code < 0 || code >= 128 }
