package core_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/render"
	. "github.com/etjob/etjob/internal/testutil"
)

// world is a small model of a cluster that applies plans the way the
// controller and the API server would, and moves pods the way kubelets,
// schedulers and clouds do, at random.
type world struct {
	r       *rand.Rand
	now     time.Time
	job     *etjobv1.ElasticJob
	pods    map[string]*corev1.Pod
	nodes   map[string]*corev1.Node
	created map[string]bool
	nodeSeq int
	log     []string
}

func (w *world) snapshot() core.Snapshot {
	var pods []*corev1.Pod
	for _, p := range w.pods {
		pods = append(pods, p.DeepCopy())
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return core.Snapshot{Job: w.job.DeepCopy(), Pods: pods, Nodes: w.nodes}
}

func deepCopySnapshot(s core.Snapshot) core.Snapshot {
	out := core.Snapshot{Job: s.Job.DeepCopy(), Nodes: map[string]*corev1.Node{}, PodNotices: map[string]string{}}
	for _, p := range s.Pods {
		out.Pods = append(out.Pods, p.DeepCopy())
	}
	for k, n := range s.Nodes {
		out.Nodes[k] = n.DeepCopy()
	}
	for k, v := range s.PodNotices {
		out.PodNotices[k] = v
	}
	return out
}

func (w *world) apply(t *testing.T, plan core.Plan) {
	for _, d := range plan.Delete {
		p := w.pods[d.Name]
		if p == nil {
			t.Fatalf("%s: plan deletes %s, which does not exist", w.trace(), d.Name)
		}
		if w.r.IntN(3) == 0 && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			ts := metav1.NewTime(w.now) // graceful deletion: gone at a later step
			p.DeletionTimestamp = &ts
		} else {
			delete(w.pods, d.Name)
		}
	}
	for _, s := range plan.Signal {
		p := w.pods[s.Pod]
		if p == nil {
			t.Fatalf("%s: plan signals %s, which does not exist", w.trace(), s.Pod)
		}
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		maps.Copy(p.Annotations, s.Annotations())
	}
	job := w.job.DeepCopy()
	job.Status = plan.Status
	var newPods []*corev1.Pod
	if plan.CreateLauncher {
		newPods = append(newPods, render.Launcher(job))
	}
	for _, i := range plan.CreateWorkers {
		newPods = append(newPods, render.PlannedWorker(job, &plan, i))
	}
	for _, p := range newPods {
		if w.created[p.Name] {
			if p.Labels[etjobv1.LabelRole] == etjobv1.RoleWorker {
				t.Fatalf("%s: worker name %s created twice", w.trace(), p.Name)
			}
			if w.pods[p.Name] != nil {
				t.Fatalf("%s: launcher %s created while it still exists", w.trace(), p.Name)
			}
		}
		w.created[p.Name] = true
		p.CreationTimestamp = metav1.NewTime(w.now) // as the API server sets it
		p.Status.Phase = corev1.PodPending
		w.pods[p.Name] = p
	}
	w.job.Status = plan.Status
}

// step moves the world at random.
func (w *world) step() {
	w.now = w.now.Add(time.Duration(w.r.IntN(20)) * time.Second)
	names := make([]string, 0, len(w.pods))
	for n := range w.pods {
		names = append(names, n)
	}
	sort.Strings(names)
	pick := func(ok func(*corev1.Pod) bool) *corev1.Pod {
		var c []*corev1.Pod
		for _, n := range names {
			if p := w.pods[n]; ok(p) {
				c = append(c, p)
			}
		}
		if len(c) == 0 {
			return nil
		}
		return c[w.r.IntN(len(c))]
	}
	alive := func(p *corev1.Pod) bool {
		return p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
	}
	switch e := w.r.IntN(100); {
	case e < 35: // a pending pod is scheduled on a new node and becomes ready
		if p := pick(func(p *corev1.Pod) bool { return alive(p) && p.Spec.NodeName == "" }); p != nil {
			w.nodeSeq++
			n := fmt.Sprintf("n%d", w.nodeSeq)
			node := MakeNode(n)
			if price := []string{"", "0.3", "0.9"}[w.r.IntN(3)]; price != "" {
				// The world's scheduler ignores Plan.AvoidNodes: the next
				// plan must still keep the members within the budget.
				node.Label(etjobv1.LabelPricePerHour, price)
			}
			w.nodes[n] = node.Obj()
			p.Spec.NodeName = n
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			w.log = append(w.log, "ready "+p.Name)
		}
	case e < 45: // graceful deletions finish
		for _, n := range names {
			if w.pods[n].DeletionTimestamp != nil {
				delete(w.pods, n)
			}
		}
		w.log = append(w.log, "deletions done")
	case e < 55: // a worker exits
		if p := pick(func(p *corev1.Pod) bool { return alive(p) && p.Spec.NodeName != "" }); p != nil {
			code := []int32{1, 75, 137, 75, 75, 0}[w.r.IntN(6)]
			if code == 0 && w.r.IntN(4) != 0 {
				code = 75
			}
			setExited(p, code, w.now)
			w.log = append(w.log, fmt.Sprintf("exit %s %d", p.Name, code))
		}
	case e < 62: // a node vanishes
		if p := pick(func(p *corev1.Pod) bool { return alive(p) && p.Spec.NodeName != "" }); p != nil {
			delete(w.nodes, p.Spec.NodeName)
			w.log = append(w.log, "node lost under "+p.Name)
		}
	case e < 72: // a reclamation notice
		if p := pick(func(p *corev1.Pod) bool { return alive(p) && p.Spec.NodeName != "" }); p != nil {
			lead := time.Duration(30+w.r.IntN(271)) * time.Second
			w.nodes[p.Spec.NodeName] = MakeNode(p.Spec.NodeName).Notice(w.now.Add(lead), "aws").Obj()
			w.log = append(w.log, fmt.Sprintf("notice under %s (%s)", p.Name, lead))
		}
	case e < 80: // a leaver exits gracefully
		if p := pick(func(p *corev1.Pod) bool { return alive(p) && p.Annotations[etjobv1.AnnotationLeave] != "" }); p != nil {
			setExited(p, etjobv1.ExitCodePreempted, w.now)
			w.log = append(w.log, "left "+p.Name)
		}
	case e < 86: // a worker reports a checkpoint through its node agent
		if p := pick(func(p *corev1.Pod) bool { return alive(p) && p.Spec.NodeName != "" }); p != nil {
			secs := 1 + w.r.IntN(60)
			p.Annotations = maps.Clone(p.Annotations)
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[etjobv1.AnnotationCheckpoint] = fmt.Sprintf(`{"step":%d,"path":"c","time":%q,"seconds":%d}`,
				1+w.r.IntN(1000), w.now.UTC().Format(time.RFC3339), secs)
			w.log = append(w.log, fmt.Sprintf("checkpoint by %s (%ds)", p.Name, secs))
		}
	case e < 92: // someone scales the job
		s := &w.job.Spec
		s.Replicas = s.MinReplicas + w.r.Int32N(s.MaxReplicas-s.MinReplicas+1)
		w.log = append(w.log, fmt.Sprintf("scale %d", s.Replicas))
	case e < 95: // suspend toggles
		b := !(w.job.Spec.Suspend != nil && *w.job.Spec.Suspend)
		w.job.Spec.Suspend = &b
		w.log = append(w.log, fmt.Sprintf("suspend %v", b))
	case e < 98: // a node's spot price changes
		if p := pick(func(p *corev1.Pod) bool { return alive(p) && w.nodes[p.Spec.NodeName] != nil }); p != nil {
			n := w.nodes[p.Spec.NodeName].DeepCopy()
			price := []string{"0.3", "0.9", "1.2"}[w.r.IntN(3)]
			// A price feed's annotation, over the label the node registered.
			n.Labels = map[string]string{etjobv1.LabelPricePerHour: "0.3"}
			n.Annotations = maps.Clone(n.Annotations)
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			n.Annotations[etjobv1.AnnotationPricePerHour] = price
			w.nodes[n.Name] = n
			w.log = append(w.log, fmt.Sprintf("price of %s's node %s", p.Name, price))
		}
	default: // time passes a lot
		w.now = w.now.Add(time.Duration(w.r.IntN(120)) * time.Second)
		w.log = append(w.log, "time passes")
	}
}

// signalStopLead is the stop lead the plan gives pod, 0 if none.
func signalStopLead(plan core.Plan, pod string) time.Duration {
	for _, s := range plan.Signal {
		if s.Pod == pod {
			return s.StopLead
		}
	}
	return 0
}

func setExited(p *corev1.Pod, code int32, at time.Time) {
	p.Status.Phase = corev1.PodFailed
	if code == 0 {
		p.Status.Phase = corev1.PodSucceeded
	}
	p.Status.Conditions = nil
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: code, FinishedAt: metav1.NewTime(at)}}}}
}

func (w *world) trace() string {
	from := max(0, len(w.log)-12)
	return "after [" + strings.Join(w.log[from:], "; ") + "]"
}

// TestDecideProperties drives Decide through random event sequences and checks,
// with computations independent of the code under test, the running
// invariant (while Running: min <= published members <= max, all ready and
// none leaving), a monotonic generation, no name created twice, never more than
// maxReplicas workers alive, backoffLimit, and finished jobs staying finished.
func TestDecideProperties(t *testing.T) {
	trainedThroughNotices = 0
	defer func() {
		// The random worlds do reach the rule that lets a noticed worker
		// stay a member until its stop time.
		if !t.Failed() && trainedThroughNotices == 0 {
			t.Errorf("no plan kept a noticed worker training through its notice")
		}
		t.Logf("%d members trained through a notice", trainedThroughNotices)
	}()
	handedOver = 0
	defer func() {
		if !t.Failed() && handedOver == 0 {
			t.Errorf("no horovod membership changed under a running horovodrun")
		}
		t.Logf("%d horovod membership changes under a running horovodrun", handedOver)
	}()
	replacedLaunchers = 0
	defer func() {
		if !t.Failed() && replacedLaunchers == 0 {
			t.Errorf("no InProcess launcher was replaced alone")
		}
		t.Logf("%d InProcess launchers replaced alone", replacedLaunchers)
	}()
	extraSeen := 0
	defer func() {
		if !t.Failed() && extraSeen == 0 {
			t.Errorf("no plan created an extra worker")
		}
		t.Logf("%d extra workers created", extraSeen)
	}()
	// 300 random worlds; 100 under -short (make test-fast, the inner loop).
	seeds := uint64(300)
	if testing.Short() {
		seeds = 100
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 42))
			lo := 1 + r.Int32N(3)
			hi := lo + r.Int32N(4)
			job := MakeElasticJob("j", "ns").Min(lo).Max(hi).Replicas(lo + r.Int32N(hi-lo+1)).BackoffLimit(r.Int32N(4)).
				MaxWaitTime([]int32{0, 60}[r.IntN(2)]).
				WorkerRestartPolicy([]etjobv1.WorkerRestartPolicy{etjobv1.WorkerRestartExitCode, etjobv1.WorkerRestartAlways}[r.IntN(2)]).
				RestartPolicy([]etjobv1.RestartPolicy{etjobv1.RestartPolicyNever, etjobv1.RestartPolicyOnFailure}[r.IntN(2)])
			switch r.IntN(3) {
			case 0:
				job.Framework(etjobv1.FrameworkHorovod)
			case 1:
				job.Recovery(etjobv1.RecoveryInProcess)
			}
			if r.IntN(2) == 0 {
				job.Growth(etjobv1.GrowthSpec{Policy: etjobv1.GrowthOpportunistic, ProbeTimeoutSeconds: 30, BackoffSeconds: []int32{0, 60}[r.IntN(2)]})
			}
			switch r.IntN(4) {
			case 0:
				job.Spot(etjobv1.SpotSpec{Enabled: true, MaxPricePerHour: "1.0", LeaveGracePeriodSeconds: 30})
			case 1:
				job.Spot(etjobv1.SpotSpec{Enabled: true, BudgetPerHour: "1.5", LeaveGracePeriodSeconds: 30})
			}
			w := &world{r: r, now: t0, job: job.Obj(), pods: map[string]*corev1.Pod{}, nodes: map[string]*corev1.Node{}, created: map[string]bool{}}
			finished := false
			for range 200 {
				prev := w.job.Status
				snap := w.snapshot()
				before := deepCopySnapshot(snap)
				plan := core.Decide(snap, w.now)
				// Decide never writes to its input: the controller hands it
				// the cache's own objects, uncopied.
				if !equality.Semantic.DeepEqual(before, deepCopySnapshot(snap)) {
					t.Fatalf("%s: Decide changed its snapshot", w.trace())
				}
				st := plan.Status
				checkInvariants(t, w, prev, plan)
				w.apply(t, plan)

				// Never more than maxReplicas workers alive after the plan.
				alive := 0
				for _, p := range w.pods {
					if p.Labels[etjobv1.LabelRole] == etjobv1.RoleWorker && p.DeletionTimestamp == nil &&
						p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
						alive++
					}
				}
				if alive > int(w.job.Spec.MaxReplicas) {
					t.Fatalf("%s: %d workers alive, max %d", w.trace(), alive, w.job.Spec.MaxReplicas)
				}
				// Extra workers only under the Opportunistic policy, and
				// never while base workers are being created.
				if len(plan.ExtraWorkers) > 0 && (!core.Opportunistic(&w.job.Spec) || len(plan.ExtraWorkers) < len(plan.CreateWorkers)) {
					t.Fatalf("%s: extra workers %v (created %v) under %+v", w.trace(), plan.ExtraWorkers, plan.CreateWorkers, w.job.Spec.Growth)
				}
				extraSeen += len(plan.ExtraWorkers)
				done := meta.IsStatusConditionTrue(st.Conditions, etjobv1.ConditionComplete) || meta.IsStatusConditionTrue(st.Conditions, etjobv1.ConditionFailed)
				if finished && !done {
					t.Fatalf("%s: a finished job became unfinished: %+v", w.trace(), st.Conditions)
				}
				if finished && (plan.CreateLauncher || len(plan.CreateWorkers) > 0) {
					t.Fatalf("%s: a finished job created pods", w.trace())
				}
				finished = done
				w.step()
			}
		})
	}
}

// trainedThroughNotices counts the members on a noticed node checkInvariants saw.
var trainedThroughNotices int

func checkInvariants(t *testing.T, w *world, prev etjobv1.ElasticJobStatus, plan core.Plan) {
	t.Helper()
	st := plan.Status
	spec := w.job.Spec
	// Generation: never backwards; moves exactly when the hosts change.
	if st.Membership.Generation < prev.Membership.Generation {
		t.Fatalf("%s: generation went back %d -> %d", w.trace(), prev.Membership.Generation, st.Membership.Generation)
	}
	changed := !slices.Equal(prev.Membership.Hosts, st.Membership.Hosts)
	if changed != (st.Membership.Generation == prev.Membership.Generation+1) || st.Membership.Generation > prev.Membership.Generation+1 {
		t.Fatalf("%s: hosts %v -> %v but generation %d -> %d", w.trace(), prev.Membership.Hosts, st.Membership.Hosts,
			prev.Membership.Generation, st.Membership.Generation)
	}
	signaled := map[string]bool{}
	for _, s := range plan.Signal {
		signaled[s.Pod] = true
	}
	deleted := map[string]bool{}
	for _, d := range plan.Delete {
		deleted[d.Name] = true
	}
	// Members are ready workers on an existing node, never a pod this plan
	// deletes, and either staying (not told to leave, on an un-noticed node
	// priced within spec.spot.maxPricePerHour, together within
	// spec.spot.budgetPerHour) or on a noticed node before their stop time: the stop time this plan
	// or an earlier one gave them, which leaves at least the stop margin
	// (15 s) before the notice's deadline, and is not here yet.
	var spend etjobv1.PricePerHour
	for _, h := range st.Membership.Hosts {
		name := h[:strings.LastIndexByte(h, ':')]
		p := w.pods[name]
		if p == nil || deleted[name] || p.DeletionTimestamp != nil {
			t.Fatalf("%s: member %s is gone or deleted", w.trace(), name)
		}
		ready := p.Status.Phase == corev1.PodRunning && len(p.Status.Conditions) > 0 && p.Status.Conditions[0].Status == corev1.ConditionTrue
		node, nodeOK := w.nodes[p.Spec.NodeName]
		if !ready || !nodeOK {
			t.Fatalf("%s: member %s is not ready (%v) or its node is gone (%v)", w.trace(), name, ready, nodeOK)
		}
		deadline := node.Annotations[etjobv1.AnnotationNodeNotice]
		if deadline == "" && !signaled[name] && p.Annotations[etjobv1.AnnotationLeave] == "" {
			// Staying, so never on a node priced above the limit.
			price, ok := etjobv1.NodePrice(node)
			if ok && spec.Spot != nil && spec.Spot.MaxPricePerHour == "1.0" && price > 1 {
				t.Fatalf("%s: member %s is on a node priced %s, above spec.spot.maxPricePerHour", w.trace(), name, price)
			}
			// Staying members together cost at most spec.spot.budgetPerHour.
			if spend += price; spec.Spot != nil && spec.Spot.BudgetPerHour == "1.5" && spend > 1.5+1e-9 {
				t.Fatalf("%s: the staying members cost %s an hour, above spec.spot.budgetPerHour", w.trace(), spend)
			}
			continue
		}
		trainedThroughNotices++
		lead := signalStopLead(plan, name)
		if lead == 0 && !signaled[name] {
			n, _ := strconv.Atoi(p.Annotations[etjobv1.AnnotationStopLead])
			lead = time.Duration(n) * time.Second
		}
		d, err := time.Parse(time.RFC3339, deadline)
		stopAt := d.Add(-lead)
		if err != nil || lead < 15*time.Second || !w.now.Before(stopAt) ||
			p.Annotations[etjobv1.AnnotationLeaveReason] != "" && !strings.HasPrefix(p.Annotations[etjobv1.AnnotationLeaveReason], "ReclaimNotice") {
			t.Fatalf("%s: member %s is leaving (notice deadline %q, stop at %s, leave reason %q) and not training through a notice",
				w.trace(), name, deadline, stopAt, p.Annotations[etjobv1.AnnotationLeaveReason])
		}
	}
	checkHorovodHandover(t, w, prev, plan, deleted, signaled)
	// A launcher is replaced alone only under spec.recovery InProcess, and
	// its replacement never restarts the job by itself.
	if st.LauncherReplacements > prev.LauncherReplacements {
		if spec.Recovery != etjobv1.RecoveryInProcess {
			t.Fatalf("%s: launcher replaced alone under spec.recovery %q", w.trace(), spec.Recovery)
		}
		if st.Restarts != prev.Restarts {
			t.Fatalf("%s: the launcher was replaced and the job restarted in one pass", w.trace())
		}
		replacedLaunchers++
	}
	// The running invariant.
	if meta.IsStatusConditionTrue(st.Conditions, etjobv1.ConditionRunning) {
		n := int32(len(st.Membership.Hosts))
		if n < spec.MinReplicas || n > spec.MaxReplicas {
			t.Fatalf("%s: Running with %d members, min %d max %d", w.trace(), n, spec.MinReplicas, spec.MaxReplicas)
		}
	}
	if st.Failures > core.BackoffLimit(&spec) && !meta.IsStatusConditionTrue(st.Conditions, etjobv1.ConditionFailed) {
		t.Fatalf("%s: %d failures over backoffLimit %d but not Failed", w.trace(), st.Failures, core.BackoffLimit(&spec))
	}
	if st.Failures > core.BackoffLimit(&spec)+1 {
		t.Fatalf("%s: failures %d counted past backoffLimit %d", w.trace(), st.Failures, core.BackoffLimit(&spec))
	}
	if st.Restarts < prev.Restarts || st.Preemptions < prev.Preemptions || st.Failures < prev.Failures {
		t.Fatalf("%s: a counter went back", w.trace())
	}
}

// replacedLaunchers counts the InProcess launchers checkInvariants saw
// replaced alone.
var replacedLaunchers int

// handedOver counts the horovod membership changes checkHorovodHandover saw
// under a running horovodrun.
var handedOver int

// checkHorovodHandover: a running horovodrun is never given a host set that
// shares no host with the one it has (it cannot broadcast the state to it),
// nor a new host once etjob told it that it stops.
func checkHorovodHandover(t *testing.T, w *world, prev etjobv1.ElasticJobStatus, plan core.Plan, deleted, signaled map[string]bool) {
	t.Helper()
	if w.job.Spec.Framework != etjobv1.FrameworkHorovod {
		return
	}
	l := w.pods[core.LauncherName(w.job.Name)]
	if l == nil || deleted[l.Name] || l.DeletionTimestamp != nil || l.Status.Phase == corev1.PodSucceeded || l.Status.Phase == corev1.PodFailed {
		return
	}
	if node := w.nodes[l.Spec.NodeName]; l.Spec.NodeName != "" && (node == nil || node.Annotations[etjobv1.AnnotationNodeNotice] != "") {
		return // lost or moving
	}
	cur := plan.Status.Membership.Hosts
	if slices.Equal(prev.Membership.Hosts, cur) {
		return
	}
	// told before, or by this very plan (stopBelowMin marks it in the pass
	// that elects the membership)
	stopped := l.Annotations[etjobv1.AnnotationLeave] != "" || signaled[l.Name]
	for _, h := range cur {
		if stopped && !slices.Contains(prev.Membership.Hosts, h) {
			t.Fatalf("%s: host %s published to a horovodrun told to stop (hosts %v -> %v)", w.trace(), h, prev.Membership.Hosts, cur)
		}
	}
	if len(prev.Membership.Hosts) == 0 || len(cur) == 0 || stopped {
		return
	}
	handedOver++
	for _, h := range cur {
		if slices.Contains(prev.Membership.Hosts, h) {
			return
		}
	}
	t.Fatalf("%s: horovod hosts %v -> %v keep no host of the set before", w.trace(), prev.Membership.Hosts, cur)
}
