package sim

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/render"
)

// epoch is the simulated wall clock's zero: the trace's time 0.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	jobName      = "sim"
	jobNamespace = "default"
	// launcherNode is the on-demand node of the launcher (the rendezvous
	// store): reliable capacity outside the trace, not counted in the cost.
	launcherNode = "on-demand-0"
	// maxPasses bounds the reconciles at one instant: the controller runs
	// again after every plan that changed something (its own writes are watch
	// events), until a plan changes nothing.
	maxPasses = 16
)

// Event kinds of the elastic simulation.
const (
	evNodeAdd = iota
	evNotice
	evNodeGone
	evPodReady
	evPodExit
	evRequeue
	evTrain
)

// elastic is the cluster model that etjob's decision core drives: the job,
// its pods and the nodes, changed by the trace (the cloud), the scheduler and
// the kubelets, and by applying each Plan the way the controller does.
type elastic struct {
	p     Params
	span  time.Duration
	now   time.Duration
	job   *etjobv1.ElasticJob
	pods  map[string]*corev1.Pod
	list  []*corev1.Pod // pods sorted by name, rebuilt when the set changes
	stale bool
	nodes map[string]*corev1.Node
	// spot lists the spot nodes alive, in the order they came: the scheduler
	// fills them in that order.
	spot     []string
	created  map[string]bool
	q        queue
	requeues map[time.Duration]bool
	dirty    bool
	// deadline and noticed are by node: its removal time in the trace, and
	// whether a notice reached a member on it.
	deadline map[string]time.Duration
	noticed  map[string]bool
	exitedAt map[string]time.Duration // by node: when its noticed worker exited
	hardNode map[string]bool
	t        trainer
	res      Result
	tooSlow  bool
	err      error
}

// RunElastic replays the trace with etjob: the same core.Decide as the
// controller, its plans applied to a model of the cluster, and the training
// model on top (see trainer).
func RunElastic(tr *Trace, p Params) (Result, error) {
	r, _, err := runElastic(tr, p)
	return r, err
}

func runElastic(tr *Trace, p Params) (Result, *elastic, error) {
	if err := p.Validate(); err != nil {
		return Result{}, nil, err
	}
	w := newElastic(tr, p)
	for w.q.Len() > 0 && w.err == nil {
		at := w.q.peek().at
		if at >= w.span {
			break
		}
		w.now = at
		for w.q.Len() > 0 && w.q.peek().at == at {
			w.handle(w.q.next())
		}
		if w.dirty {
			w.reconcile()
		}
	}
	if w.err != nil {
		return Result{}, w, w.err
	}
	w.t.finish(w.span)
	st := tr.Stats()
	r := w.t.led.result(StrategyElastic, tr.Name, w.span, st.NodeSeconds, p.SpotPrice)
	r.Notice = p.Provider.String()
	r.ResumePauseSeconds = p.ResumePause.Seconds()
	r.CheckpointSeconds = w.t.interval.Seconds()
	r.DecideCalls = w.res.DecideCalls
	r.NoticeUnusedSeconds = w.res.NoticeUnusedSeconds
	r.KilledByDeletion = w.res.KilledByDeletion
	r.StoppedBelowMin = w.res.StoppedBelowMin
	for name := range w.created {
		if name != core.LauncherName(jobName) {
			r.PodsCreated++
		}
	}
	r.Warnings = w.res.Warnings
	if w.tooSlow {
		r.Warnings = append(r.Warnings, "Decide raised CheckpointTooSlow: the checkpoint takes longer than the provider's notice window")
	}
	if w.res.KilledByDeletion > 0 {
		r.Warnings = append(r.Warnings, fmt.Sprintf("%d leaving workers were deleted before their checkpoint was written (spec.spot.leaveGracePeriodSeconds %gs < notice -> stop + checkpoint %gs)",
			w.res.KilledByDeletion, p.LeaveGrace.Seconds(), (p.NoticeStop+p.CheckpointTime).Seconds()))
	}
	return r, w, nil
}

func newElastic(tr *Trace, p Params) *elastic {
	w := &elastic{
		p: p, span: tr.Span(),
		pods: map[string]*corev1.Pod{}, nodes: map[string]*corev1.Node{}, created: map[string]bool{},
		requeues: map[time.Duration]bool{}, deadline: map[string]time.Duration{}, noticed: map[string]bool{},
		exitedAt: map[string]time.Duration{}, hardNode: map[string]bool{},
	}
	w.job = simJob(p)
	w.nodes[launcherNode] = &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: launcherNode, Labels: map[string]string{etjobv1.LabelCapacityType: etjobv1.CapacityTypeOnDemand}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
	failures := 0
	if p.hardLoss() {
		failures = tr.Stats().RemoveTimes
	}
	w.t = trainer{w: w, interval: p.youngDaly(w.span, failures), led: p.ledger()}
	w.t.led.state(0, true, false)

	added := map[string]time.Duration{}
	kill := p.Provider.Window - p.Provider.Usable
	for _, e := range tr.Events {
		if e.Add {
			added[e.Node] = e.At
			w.q.push(e.At, evNodeAdd, e.Node, 0)
			continue
		}
		w.deadline[e.Node] = e.At
		if p.Provider.Window > 0 {
			w.q.push(max(added[e.Node], e.At-p.Provider.Window), evNotice, e.Node, 0)
		}
		w.q.push(max(added[e.Node], e.At-kill), evNodeGone, e.Node, 0)
	}
	w.dirty = true
	return w
}

// simJob is the simulated ElasticJob as the API server would default it:
// torchrun, spot, one GPU per worker, replicas = maxReplicas (or replicas
// GrowFrom, growing opportunistically to maxReplicas).
func simJob(p Params) *etjobv1.ElasticJob {
	backoff := int32(6)
	margin := int32(p.StopMargin / time.Second)
	replicas := p.Replicas
	var growth *etjobv1.GrowthSpec
	if p.GrowFrom > 0 {
		replicas = p.GrowFrom
		growth = &etjobv1.GrowthSpec{Policy: etjobv1.GrowthOpportunistic, PriorityClassName: etjobv1.DefaultGrowthPriorityClass,
			ProbeTimeoutSeconds: 120, BackoffSeconds: 300, MinSamplesPerSecondPerWorker: p.MinGainPerWorker}
	}
	return &etjobv1.ElasticJob{
		TypeMeta:   metav1.TypeMeta{APIVersion: etjobv1.GroupVersion.String(), Kind: "ElasticJob"},
		ObjectMeta: metav1.ObjectMeta{Name: jobName, Namespace: jobNamespace, UID: types.UID(jobName + "-uid"), Generation: 1},
		Spec: etjobv1.ElasticJobSpec{
			Replicas: replicas, MinReplicas: p.MinReplicas, MaxReplicas: p.Replicas,
			Growth:              growth,
			Framework:           etjobv1.FrameworkTorchrun,
			RestartPolicy:       etjobv1.RestartPolicyNever,
			WorkerRestartPolicy: etjobv1.WorkerRestartExitCode,
			CleanPodPolicy:      etjobv1.CleanPodPolicyRunning,
			BackoffLimit:        &backoff,
			CheckpointDir:       "/ckpt",
			Spot: &etjobv1.SpotSpec{Enabled: true, LeaveGracePeriodSeconds: int32(p.LeaveGrace / time.Second),
				NoticeLeadTime: p.NoticeLeadTime, StopMarginSeconds: &margin},
			WorkerTemplate: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "worker", Image: "train", Command: []string{"torchrun", "train.py"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{etjobv1.ResourceGPU: *resourceOne()}},
			}}}},
		},
	}
}

func resourceOne() *resource.Quantity { return resource.NewQuantity(1, resource.DecimalSI) }

func (w *elastic) at() time.Time { return epoch.Add(w.now) }

func (w *elastic) handle(e *event) {
	switch e.kind {
	case evNodeAdd:
		w.addNode(e.name)
	case evNotice:
		w.notice(e.name)
	case evNodeGone:
		w.nodeGone(e.name)
	case evPodReady:
		if p := w.pods[e.name]; p != nil && !terminal(p) && w.nodes[p.Spec.NodeName] != nil {
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			w.dirty = true
		}
	case evPodExit:
		w.exit(e.name)
	case evRequeue:
		delete(w.requeues, e.at)
		w.dirty = true
	case evTrain:
		w.t.phaseEnd(e.gen)
	}
}

func (w *elastic) addNode(name string) {
	prov := w.p.Provider
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			etjobv1.LabelCapacityType: etjobv1.CapacityTypeSpot, etjobv1.LabelCloudProvider: prov.Name,
		}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
	if prov.ProviderIDPrefix != "" {
		n.Spec.ProviderID = prov.ProviderIDPrefix + name
	}
	w.nodes[name] = n
	w.spot = append(w.spot, name)
	w.dirty = true
}

// notice marks the node as its agent does: the deadline annotation, its
// source, and the NoSchedule taint.
func (w *elastic) notice(name string) {
	n := w.nodes[name]
	if n == nil {
		return
	}
	n.Annotations = map[string]string{
		etjobv1.AnnotationNodeNotice:       epoch.Add(w.deadline[name]).UTC().Format(time.RFC3339),
		etjobv1.AnnotationNodeNoticeSource: w.p.Provider.Name,
	}
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: etjobv1.TaintReclaiming, Effect: corev1.TaintEffectNoSchedule})
	for _, p := range w.podsOn(name) {
		if w.t.member(p.Name) {
			w.noticed[name] = true
		}
	}
	w.dirty = true
}

// nodeGone removes the node: its processes die with it.
func (w *elastic) nodeGone(name string) {
	if w.nodes[name] == nil {
		return
	}
	pods := w.podsOn(name)
	delete(w.nodes, name)
	w.spot = slices.DeleteFunc(w.spot, func(s string) bool { return s == name })
	hit := false
	for _, p := range pods {
		if !terminal(p) && w.t.podGone(w.now, p.Name) {
			hit = true
		}
	}
	switch {
	case hit || w.hardNode[name]:
		w.t.led.hard++
	case w.noticed[name]:
		w.t.led.notice++
		if at, ok := w.exitedAt[name]; ok {
			w.res.NoticeUnusedSeconds += (w.now - at).Seconds()
		}
	}
	w.dirty = true
}

func (w *elastic) podsOn(node string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range w.podList() {
		if p.Spec.NodeName == node {
			out = append(out, p)
		}
	}
	return out
}

// exit ends a worker the way the worker library does after a signal: the
// documented graceful exit code.
func (w *elastic) exit(name string) {
	p := w.pods[name]
	if p == nil || terminal(p) || w.nodes[p.Spec.NodeName] == nil {
		return
	}
	p.Status.Phase = corev1.PodFailed
	p.Status.Conditions = nil
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: etjobv1.ExitCodePreempted, FinishedAt: metav1.NewTime(w.at())},
	}}}
	if w.noticed[p.Spec.NodeName] && !w.hardNode[p.Spec.NodeName] {
		w.exitedAt[p.Spec.NodeName] = w.now
	}
	w.dirty = true
}

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func ready(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && len(p.Status.Conditions) > 0 && p.Status.Conditions[0].Status == corev1.ConditionTrue
}

func (w *elastic) podList() []*corev1.Pod {
	if w.stale {
		w.list = w.list[:0]
		for _, p := range w.pods {
			w.list = append(w.list, p)
		}
		sort.Slice(w.list, func(i, j int) bool { return w.list[i].Name < w.list[j].Name })
		w.stale = false
	}
	return w.list
}

// reconcile runs the controller until a plan changes nothing.
func (w *elastic) reconcile() {
	w.dirty = false
	for pass := 0; ; pass++ {
		if pass == maxPasses {
			w.res.Warnings = append(w.res.Warnings, fmt.Sprintf("at %s the plans did not settle after %d passes", w.now, maxPasses))
			return
		}
		w.schedule()
		prev := w.job.Status
		plan := core.Decide(core.Snapshot{Job: w.job, Pods: w.podList(), Nodes: w.nodes}, w.at())
		w.res.DecideCalls++
		if w.p.CheckInvariants {
			if err := w.check(prev, plan); err != nil {
				w.err = fmt.Errorf("at %s (pass %d): %w", w.now, pass, err)
				return
			}
		}
		acted := w.apply(plan)
		if plan.RequeueAfter > 0 {
			if at := w.now + plan.RequeueAfter; !w.requeues[at] {
				w.requeues[at] = true
				w.q.push(at, evRequeue, "", 0)
			}
		}
		if !acted {
			return
		}
	}
}

// schedule is kube-scheduler: pending workers, by index, go to free spot nodes
// without the reclaiming taint, one worker per node, in the order the nodes
// came; the launcher goes to the on-demand node. A bound pod is ready after
// StartDelay.
func (w *elastic) schedule() {
	busy := map[string]bool{}
	var pending []*corev1.Pod
	for _, p := range w.podList() {
		switch {
		case terminal(p):
		case p.Spec.NodeName != "":
			busy[p.Spec.NodeName] = true
		default:
			pending = append(pending, p)
		}
	}
	if len(pending) == 0 {
		return
	}
	sort.SliceStable(pending, func(i, j int) bool { return workerIndex(pending[i]) < workerIndex(pending[j]) })
	free := 0
	for _, p := range pending {
		node := ""
		if p.Labels[etjobv1.LabelRole] == etjobv1.RoleLauncher {
			node = launcherNode
		} else {
			for ; free < len(w.spot); free++ {
				n := w.nodes[w.spot[free]]
				if !busy[n.Name] && n.Annotations[etjobv1.AnnotationNodeNotice] == "" {
					node = n.Name
					free++
					break
				}
			}
		}
		if node == "" {
			continue
		}
		p.Spec.NodeName = node
		w.q.push(w.now+w.p.StartDelay, evPodReady, p.Name, 0)
	}
}

// workerIndex is a worker's index; -1 for the launcher.
func workerIndex(p *corev1.Pod) int {
	i, err := strconv.Atoi(p.Labels[etjobv1.LabelWorkerIndex])
	if err != nil {
		return -1
	}
	return i
}

// apply carries out a plan as the controller does (deletions, signals,
// creations, then the status with the membership) and reports whether it
// changed anything.
func (w *elastic) apply(plan core.Plan) bool {
	acted := len(plan.Delete) > 0 || len(plan.Signal) > 0 || len(plan.CreateWorkers) > 0 || plan.CreateLauncher
	for _, d := range plan.Delete {
		p := w.pods[d.Name]
		if p == nil {
			continue
		}
		delete(w.pods, d.Name)
		w.stale = true
		if !terminal(p) && p.Spec.NodeName != "" && w.t.podGone(w.now, d.Name) {
			// Deleted while the training needed it (its grace ran out):
			// counted as a hard loss when its node goes.
			w.hardNode[p.Spec.NodeName] = true
			w.res.KilledByDeletion++
		}
	}
	for _, s := range plan.Signal {
		p := w.pods[s.Pod]
		if p == nil {
			continue
		}
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		maps.Copy(p.Annotations, s.Annotations())
		if s.Reason == etjobv1.ReasonWaitingForCapacity {
			w.res.StoppedBelowMin++
		}
		if !w.t.needs(p.Name) {
			w.q.push(w.now+w.p.NoticeStop, evPodExit, p.Name, 0)
		}
	}
	job := *w.job
	job.Status = plan.Status
	var created []*corev1.Pod
	if plan.CreateLauncher {
		created = append(created, render.Launcher(&job))
	}
	for _, i := range plan.CreateWorkers {
		created = append(created, render.PlannedWorker(&job, &plan, i))
	}
	for _, p := range created {
		if w.pods[p.Name] != nil {
			continue // AlreadyExists
		}
		w.created[p.Name] = true
		p.CreationTimestamp = metav1.NewTime(w.at()) // as the API server sets it: the growth probes' timeout counts from it
		p.Status.Phase = corev1.PodPending
		w.pods[p.Name] = p
		w.stale = true
	}
	w.job.Status = plan.Status
	if meta.IsStatusConditionTrue(plan.Status.Conditions, etjobv1.ConditionCheckpointTooSlow) {
		w.tooSlow = true
	}
	if plan.Membership != nil {
		acted = true
	}
	w.t.setTarget(w.now, hostNames(plan.Status.Membership.Hosts))
	return acted
}

func hostNames(hosts []string) []string {
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		out = append(out, core.HostName(h))
	}
	return out
}

// leaving reports whether a pod was told to leave or its node is reclaimed.
func (w *elastic) leaving(p *corev1.Pod) bool {
	if p.Annotations[etjobv1.AnnotationLeave] != "" {
		return true
	}
	n := w.nodes[p.Spec.NodeName]
	return n != nil && n.Annotations[etjobv1.AnnotationNodeNotice] != ""
}

// reportCheckpoint publishes a checkpoint on the pod as its node agent does
// (etjob.dev/checkpoint), so Decide sees status.lastCheckpoint and can raise
// CheckpointTooSlow.
func (w *elastic) reportCheckpoint(pod string, step int64, workers int) {
	p := w.pods[pod]
	if p == nil {
		return
	}
	raw, _ := json.Marshal(etjobv1.CheckpointAnnotation{
		Step: step, Path: fmt.Sprintf("/ckpt/step-%d", step),
		Time: w.at().UTC().Format(time.RFC3339), Seconds: w.p.CheckpointTime.Seconds(),
		SamplesPerSecond: w.t.led.throughput(workers), Workers: int32(workers),
	})
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[etjobv1.AnnotationCheckpoint] = string(raw)
	w.dirty = true
}
