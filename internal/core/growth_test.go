package core_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

// growJob is a running job of 2 base members, max 4, under the
// Opportunistic growth policy; members are j-worker-0 and -1 on n0 and n1.
func growJob(tweak func(*etjobv1.GrowthSpec), st etjobv1.GrowthStatus, hosts ...string) *JobWrapper {
	g := etjobv1.GrowthSpec{Policy: etjobv1.GrowthOpportunistic, ProbeTimeoutSeconds: 60, BackoffSeconds: 300}
	if tweak != nil {
		tweak(&g)
	}
	if hosts == nil {
		hosts = []string{"j-worker-0:1", "j-worker-1:1"}
	}
	changed := metav1.NewTime(t0.Add(-10 * time.Minute))
	return MakeElasticJob("j", "ns").Replicas(2).Min(1).Max(4).Growth(g).Status(running(etjobv1.ElasticJobStatus{
		NextWorkerIndex: int32(len(hosts)) + 2,
		Membership:      etjobv1.MembershipStatus{Generation: 3, Hosts: hosts, ChangeTime: &changed},
		Growth:          &st,
	}))
}

// growPods are the launcher and base workers 0 and 1, ready.
func growPods(job *etjobv1.ElasticJob, more ...*corev1.Pod) []*corev1.Pod {
	return append([]*corev1.Pod{
		MakeLauncher(job).Ready("od").Obj(),
		MakeWorker(job, 0).ReadySince("n0", t0.Add(-time.Hour)).Obj(),
		MakeWorker(job, 1).ReadySince("n1", t0.Add(-time.Hour)).Obj(),
	}, more...)
}

func decideAt(job *etjobv1.ElasticJob, pods []*corev1.Pod, now time.Time, nodeNames ...string) core.Plan {
	return core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes(append([]string{"od", "n0", "n1"}, nodeNames...)...)}, now)
}

func checkpointed(p *PodWrapper, sps float64, at time.Time) *PodWrapper {
	b, _ := json.Marshal(etjobv1.CheckpointAnnotation{Step: 10, Path: "c", Time: at.Format(time.RFC3339), Seconds: 0.5, SamplesPerSecond: sps})
	return p.Annotation(etjobv1.AnnotationCheckpoint, string(b))
}

// TestDecideGrowth runs the rules of opportunistic growth (growth.go).
func TestDecideGrowth(t *testing.T) {
	t.Run("probes up to maxReplicas with extra workers", func(t *testing.T) {
		job := growJob(nil, etjobv1.GrowthStatus{}).Obj()
		plan := decideAt(job, growPods(job), t0)
		if diff := cmp.Diff([]int32{4, 5}, plan.CreateWorkers); diff != "" {
			t.Errorf("CreateWorkers (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]int32{4, 5}, plan.ExtraWorkers); diff != "" {
			t.Errorf("ExtraWorkers (-want +got):\n%s", diff)
		}
		g := plan.Status.Growth
		if g == nil || g.ExtraWorkers != 2 || g.Limit != 4 || g.Reason != "MaxReplicas" {
			t.Errorf("status.growth = %+v, want 2 extra workers, limit 4 (MaxReplicas)", g)
		}
	})
	t.Run("the Replicas policy grows to replicas only", func(t *testing.T) {
		job := growJob(func(g *etjobv1.GrowthSpec) { g.Policy = etjobv1.GrowthReplicas }, etjobv1.GrowthStatus{}).Obj()
		plan := decideAt(job, growPods(job), t0)
		if len(plan.CreateWorkers) != 0 || plan.Status.Growth != nil {
			t.Errorf("created %v, status.growth %+v; want nothing", plan.CreateWorkers, plan.Status.Growth)
		}
	})
	t.Run("a job queued by Kueue does not grow above what was admitted", func(t *testing.T) {
		job := growJob(nil, etjobv1.GrowthStatus{}).Label(etjobv1.LabelKueueQueue, "team-a").Obj()
		plan := decideAt(job, growPods(job), t0)
		if len(plan.CreateWorkers) != 0 || plan.Status.Growth.Reason != "Admitted" || plan.Status.Growth.Limit != 2 {
			t.Errorf("created %v, status.growth %+v; want none, limit 2 (Admitted)", plan.CreateWorkers, plan.Status.Growth)
		}
	})
	t.Run("base workers come first: no probe while the base is short, extra workers kept", func(t *testing.T) {
		job := growJob(nil, etjobv1.GrowthStatus{}, "j-worker-0:1", "j-worker-1:1", "j-worker-4:1").Obj()
		pods := growPods(job, MakeWorker(job, 4).Extra(t0.Add(-time.Hour)).ReadySince("n4", t0.Add(-time.Hour)).Obj())
		pods[2].Spec.NodeName = "gone" // worker 1's node was lost
		plan := decideAt(job, pods, t0, "n4")
		if diff := cmp.Diff([]int32{5}, plan.CreateWorkers); diff != "" {
			t.Errorf("CreateWorkers (-want +got):\n%s", diff)
		}
		if len(plan.ExtraWorkers) != 0 || len(plan.Signal) != 0 {
			t.Errorf("extra %v, signals %+v; want a base worker only, nobody told to leave", plan.ExtraWorkers, plan.Signal)
		}
		if g := plan.Status.Growth; g.Reason != "Replicas" || g.ExtraWorkers != 1 {
			t.Errorf("status.growth = %+v, want 1 extra worker held (Replicas)", g)
		}
	})
	t.Run("an extra worker waiting to be scheduled holds further probes", func(t *testing.T) {
		job := growJob(nil, etjobv1.GrowthStatus{}).Obj()
		plan := decideAt(job, growPods(job, MakeWorker(job, 4).Extra(t0.Add(-20*time.Second)).Obj()), t0)
		if len(plan.CreateWorkers) != 0 || len(plan.Delete) != 0 {
			t.Errorf("created %v, deleted %+v; want neither", plan.CreateWorkers, plan.Delete)
		}
		if plan.RequeueAfter != 40*time.Second || plan.Status.Growth.Reason != "Probing" {
			t.Errorf("RequeueAfter %v, status.growth %+v; want 40s (the probe's timeout), Probing", plan.RequeueAfter, plan.Status.Growth)
		}
	})
	t.Run("a probe not scheduled within its timeout is given up, then no probe for the backoff", func(t *testing.T) {
		job := growJob(nil, etjobv1.GrowthStatus{}).Obj()
		plan := decideAt(job, growPods(job, MakeWorker(job, 4).Extra(t0.Add(-61*time.Second)).Obj()), t0)
		if diff := cmp.Diff([]string{"j-worker-4"}, deletedNames(plan)); diff != "" {
			t.Errorf("Delete (-want +got):\n%s", diff)
		}
		g := plan.Status.Growth
		if len(plan.CreateWorkers) != 0 || g.BackoffUntil == nil || !g.BackoffUntil.Equal(&metav1.Time{Time: t0.Add(300 * time.Second)}) || g.Reason != "Backoff" {
			t.Fatalf("created %v, status.growth %+v; want none, backoff until t0+300s", plan.CreateWorkers, g)
		}
		if plan.Status.Preemptions != 0 || plan.Status.Failures != 0 {
			t.Errorf("preemptions/failures %d/%d, want 0/0", plan.Status.Preemptions, plan.Status.Failures)
		}
		// The next pass, in the backoff and after it.
		job.Status = plan.Status
		plan = decideAt(job, growPods(job), t0.Add(time.Minute))
		if len(plan.CreateWorkers) != 0 || plan.RequeueAfter != 4*time.Minute {
			t.Errorf("in the backoff: created %v, RequeueAfter %v; want none, 4m", plan.CreateWorkers, plan.RequeueAfter)
		}
		plan = decideAt(job, growPods(job), t0.Add(300*time.Second))
		if diff := cmp.Diff([]int32{5, 6}, plan.ExtraWorkers); diff != "" { // names are never reused
			t.Errorf("after the backoff, ExtraWorkers (-want +got):\n%s", diff)
		}
	})
	t.Run("an extra worker taken back by the scheduler leaves at an agreed step, and growth backs off", func(t *testing.T) {
		job := growJob(nil, etjobv1.GrowthStatus{}, "j-worker-0:1", "j-worker-1:1", "j-worker-4:1").Obj()
		plan := decideAt(job, growPods(job,
			MakeWorker(job, 4).Extra(t0.Add(-time.Hour)).ReadySince("n4", t0.Add(-time.Hour)).Condition(corev1.DisruptionTarget).Obj()), t0, "n4")
		if diff := cmp.Diff([]string{"j-worker-4"}, signaled(plan)); diff != "" {
			t.Errorf("Signal (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"j-worker-0:1", "j-worker-1:1"}, plan.Status.Membership.Hosts); diff != "" {
			t.Errorf("hosts (-want +got):\n%s", diff)
		}
		g := plan.Status.Growth
		if len(plan.CreateWorkers) != 0 || g.BackoffUntil == nil || !g.BackoffUntil.Time.Equal(t0.Add(300*time.Second)) || g.ExtraWorkers != 0 {
			t.Errorf("created %v, status.growth %+v; want none, 0 extra, backoff until t0+300s", plan.CreateWorkers, g)
		}
	})
	t.Run("throughput is measured from the checkpoints reported since the change", func(t *testing.T) {
		job := growJob(nil, etjobv1.GrowthStatus{Throughput: []etjobv1.ThroughputPoint{{Workers: 2, SamplesPerSecond: 5}}}, "j-worker-0:1", "j-worker-1:1", "j-worker-4:1").Obj()
		after := t0.Add(-time.Minute)
		pods := growPods(job, checkpointed(MakeWorker(job, 4).Extra(t0.Add(-time.Hour)).ReadySince("n4", t0.Add(-time.Hour)), 110.2, after).Obj())
		pods[1] = checkpointed(MakeWorker(job, 0).ReadySince("n0", t0.Add(-time.Hour)), 100, after).Obj()
		pods[2] = checkpointed(MakeWorker(job, 1).ReadySince("n1", t0.Add(-time.Hour)), 105.4, after).Obj()
		plan := decideAt(job, pods, t0, "n4")
		want := []etjobv1.ThroughputPoint{{Workers: 2, SamplesPerSecond: 5}, {Workers: 3, SamplesPerSecond: 316}}
		if diff := cmp.Diff(want, plan.Status.Growth.Throughput); diff != "" {
			t.Errorf("throughput (-want +got):\n%s", diff)
		}
		// A checkpoint older than the membership does not count; rank 0
		// alone may report the whole job's throughput.
		pods[1] = checkpointed(MakeWorker(job, 0).ReadySince("n0", t0.Add(-time.Hour)), 300, after).Obj()
		pods[2] = MakeWorker(job, 1).ReadySince("n1", t0.Add(-time.Hour)).Obj()
		pods[3] = checkpointed(MakeWorker(job, 4).Extra(t0.Add(-time.Hour)).ReadySince("n4", t0.Add(-time.Hour)), 99, t0.Add(-time.Hour)).Obj()
		plan = decideAt(job, pods, t0, "n4")
		want[1].SamplesPerSecond = 300
		if diff := cmp.Diff(want, plan.Status.Growth.Throughput); diff != "" {
			t.Errorf("with rank 0's report alone, throughput (-want +got):\n%s", diff)
		}
		// A report says the size it was measured with: rank 0's checkpoint
		// of the stop, written after the change to 3, measured 2 workers.
		b, _ := json.Marshal(etjobv1.CheckpointAnnotation{Step: 10, Path: "c", Time: after.Format(time.RFC3339), SamplesPerSecond: 210, Workers: 2})
		pods[1] = MakeWorker(job, 0).ReadySince("n0", t0.Add(-time.Hour)).Annotation(etjobv1.AnnotationCheckpoint, string(b)).Obj()
		plan = decideAt(job, pods, t0, "n4")
		if diff := cmp.Diff([]etjobv1.ThroughputPoint{{Workers: 2, SamplesPerSecond: 210}}, plan.Status.Growth.Throughput); diff != "" {
			t.Errorf("with a report measured at 2 workers, throughput (-want +got):\n%s", diff)
		}
		// Nothing reported since the change: no point.
		pods[1] = MakeWorker(job, 0).ReadySince("n0", t0.Add(-time.Hour)).Obj()
		plan = decideAt(job, pods, t0, "n4")
		if diff := cmp.Diff(want[:1], plan.Status.Growth.Throughput); diff != "" {
			t.Errorf("with no report since the change, throughput (-want +got):\n%s", diff)
		}
	})
	t.Run("growth stops where an added worker gains less than the threshold, extra workers given back", func(t *testing.T) {
		pts := []etjobv1.ThroughputPoint{{Workers: 2, SamplesPerSecond: 200}, {Workers: 3, SamplesPerSecond: 290}, {Workers: 4, SamplesPerSecond: 300}}
		job := growJob(func(g *etjobv1.GrowthSpec) { g.MinSamplesPerSecondPerWorker = 50 },
			etjobv1.GrowthStatus{Throughput: pts}, "j-worker-0:1", "j-worker-1:1", "j-worker-4:1", "j-worker-5:1").Obj()
		plan := decideAt(job, growPods(job,
			MakeWorker(job, 4).Extra(t0.Add(-time.Hour)).ReadySince("n4", t0.Add(-time.Hour)).Obj(),
			MakeWorker(job, 5).Extra(t0.Add(-time.Hour)).ReadySince("n5", t0.Add(-time.Hour)).Obj()), t0, "n4", "n5")
		if diff := cmp.Diff([]string{"j-worker-5"}, signaled(plan)); diff != "" {
			t.Errorf("Signal (-want +got):\n%s", diff)
		}
		if s := plan.Signal; len(s) == 1 && s[0].Reason != etjobv1.ReasonGrowth {
			t.Errorf("signal reason %q, want %q", s[0].Reason, etjobv1.ReasonGrowth)
		}
		if g := plan.Status.Growth; g.Limit != 3 || g.Reason != "Throughput" || g.ExtraWorkers != 1 || len(plan.CreateWorkers) != 0 {
			t.Errorf("created %v, status.growth %+v; want none, limit 3 (Throughput), 1 extra", plan.CreateWorkers, g)
		}
		// Off at 0: the same world grows to max.
		job.Spec.Growth.MinSamplesPerSecondPerWorker = 0
		if plan := decideAt(job, growPods(job,
			MakeWorker(job, 4).Extra(t0.Add(-time.Hour)).ReadySince("n4", t0.Add(-time.Hour)).Obj(),
			MakeWorker(job, 5).Extra(t0.Add(-time.Hour)).ReadySince("n5", t0.Add(-time.Hour)).Obj()), t0, "n4", "n5"); len(plan.Signal) != 0 {
			t.Errorf("with the rule off, signals %+v; want none", plan.Signal)
		}
	})
	t.Run("extra workers are given back first, the unscheduled ones before the others", func(t *testing.T) {
		job := growJob(func(g *etjobv1.GrowthSpec) { g.Policy = etjobv1.GrowthReplicas }, etjobv1.GrowthStatus{},
			"j-worker-0:1", "j-worker-1:1", "j-worker-4:1").Obj()
		plan := decideAt(job, growPods(job,
			MakeWorker(job, 4).Extra(t0.Add(-time.Hour)).ReadySince("n4", t0.Add(-time.Hour)).Obj(),
			MakeWorker(job, 5).Extra(t0.Add(-time.Second)).Obj()), t0, "n4")
		if diff := cmp.Diff([]string{"j-worker-4"}, signaled(plan)); diff != "" {
			t.Errorf("Signal (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"j-worker-5"}, deletedNames(plan)); diff != "" {
			t.Errorf("Delete (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"j-worker-0:1", "j-worker-1:1"}, plan.Status.Membership.Hosts); diff != "" {
			t.Errorf("hosts (-want +got):\n%s", diff)
		}
	})
	t.Run("a released extra worker is neither a failure nor a preemption", func(t *testing.T) {
		job := growJob(nil, etjobv1.GrowthStatus{}).Obj()
		plan := decideAt(job, growPods(job,
			MakeWorker(job, 4).Extra(t0.Add(-time.Hour)).Told(t0.Add(-time.Minute), etjobv1.ReasonGrowth).Exited(etjobv1.ExitCodePreempted, t0.Add(-time.Second)).Obj()), t0)
		if plan.Status.Preemptions != 0 || plan.Status.Failures != 0 || len(deletedNames(plan)) != 1 {
			t.Errorf("preemptions/failures %d/%d, deleted %v; want 0/0 and the pod deleted", plan.Status.Preemptions, plan.Status.Failures, deletedNames(plan))
		}
	})
}

// TestDecidePrice runs the rules of spec.spot.maxPricePerHour (price.go).
func TestDecidePrice(t *testing.T) {
	job := MakeElasticJob("j", "ns").Replicas(2).Min(1).Max(4).Spot(etjobv1.SpotSpec{Enabled: true, MaxPricePerHour: "1.0", LeaveGracePeriodSeconds: 30}).
		Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: etjobv1.MembershipStatus{Generation: 3, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj()
	priced := func(price string) map[string]*corev1.Node {
		ns := nodes("od", "n0", "cheap")
		ns["n1"] = MakeNode("n1").Label(etjobv1.LabelPricePerHour, price).Obj()
		ns["pricey"] = MakeNode("pricey").Label(etjobv1.LabelPricePerHour, "3").Obj()
		return ns
	}
	pods := func(w1 *corev1.Pod) []*corev1.Pod {
		return []*corev1.Pod{MakeLauncher(job).Ready("od").Obj(), MakeWorker(job, 0).Ready("n0").Obj(), w1}
	}
	t.Run("a price rise above the limit makes the worker leave at an agreed step, replaced off the priced nodes", func(t *testing.T) {
		plan := core.Decide(core.Snapshot{Job: job, Pods: pods(MakeWorker(job, 1).Ready("n1").Obj()), Nodes: priced("1.25")}, t0)
		if len(plan.Signal) != 1 || plan.Signal[0].Pod != "j-worker-1" || plan.Signal[0].Reason != etjobv1.ReasonPriceAboveMax {
			t.Fatalf("signals %+v, want j-worker-1 told to leave for %s", plan.Signal, etjobv1.ReasonPriceAboveMax)
		}
		if diff := cmp.Diff([]int32{2}, plan.CreateWorkers); diff != "" {
			t.Errorf("CreateWorkers (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"n1", "pricey"}, plan.AvoidNodes); diff != "" {
			t.Errorf("AvoidNodes (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"j-worker-0:1"}, plan.Status.Membership.Hosts); diff != "" {
			t.Errorf("hosts (-want +got):\n%s", diff)
		}
	})
	t.Run("at or below the limit nothing happens", func(t *testing.T) {
		plan := core.Decide(core.Snapshot{Job: job, Pods: pods(MakeWorker(job, 1).Ready("n1").Obj()), Nodes: priced("1.0")}, t0)
		if len(plan.Signal) != 0 || len(plan.CreateWorkers) != 0 {
			t.Errorf("signals %+v, creates %v; want none", plan.Signal, plan.CreateWorkers)
		}
	})
	t.Run("the worker that left for the price is a release", func(t *testing.T) {
		w1 := MakeWorker(job, 1).Ready("n1").Told(t0.Add(-time.Minute), etjobv1.ReasonPriceAboveMax).Exited(etjobv1.ExitCodePreempted, t0.Add(-time.Second)).Obj()
		plan := core.Decide(core.Snapshot{Job: job, Pods: pods(w1), Nodes: priced("1.25")}, t0)
		if plan.Status.Preemptions != 0 || plan.Status.Failures != 0 {
			t.Errorf("preemptions/failures %d/%d, want 0/0", plan.Status.Preemptions, plan.Status.Failures)
		}
	})
	t.Run("without a limit prices are not read", func(t *testing.T) {
		free := job.DeepCopy()
		free.Spec.Spot.MaxPricePerHour = ""
		plan := core.Decide(core.Snapshot{Job: free, Pods: pods(MakeWorker(job, 1).Ready("n1").Obj()), Nodes: priced("9")}, t0)
		if len(plan.Signal) != 0 || plan.AvoidNodes != nil {
			t.Errorf("signals %+v, avoid %v; want none", plan.Signal, plan.AvoidNodes)
		}
	})
}
