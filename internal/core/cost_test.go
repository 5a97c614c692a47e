package core_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

// priced is a node with a capacity type, an instance type and a price.
func priced(name, capacity, price string) *corev1.Node {
	return MakeNode(name).Label(etjobv1.LabelCapacityType, capacity).Label(etjobv1.LabelInstanceType, "p3.2xlarge").
		Label(etjobv1.LabelPricePerHour, price).Obj()
}

// TestBill checks status.cost (cost.go): each worker pod adds the time it ran
// since the bill's last update, at its node's price, next to the on-demand
// price of the same instance type; the bill survives the pods.
func TestBill(t *testing.T) {
	job := base().Replicas(2)
	members := etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}
	nodes := map[string]*corev1.Node{
		"od": priced("od", etjobv1.CapacityTypeOnDemand, "3.06"),
		"s0": priced("s0", etjobv1.CapacityTypeSpot, "0.91"),
		"s1": priced("s1", etjobv1.CapacityTypeSpot, "1.2"),
	}
	spot := func(price string, ms int64) etjobv1.CostRow {
		return etjobv1.CostRow{CapacityType: "spot", InstanceType: "p3.2xlarge", PricePerHour: price, OnDemandPricePerHour: "3.06", Milliseconds: ms}
	}
	at := func(d time.Duration) *metav1.MicroTime { return &metav1.MicroTime{Time: t0.Add(d)} }
	testCases := map[string]struct {
		prev     *etjobv1.CostStatus
		pods     []*corev1.Pod
		want     *etjobv1.CostStatus
		wantNext time.Duration // the requeue the bill asks for (0: none of its own)
	}{
		"the first bill: two workers since they started": {
			pods: []*corev1.Pod{
				MakeWorker(job.Obj(), 0).Ready("s0").Started(t0.Add(-time.Hour)).Obj(),
				MakeWorker(job.Obj(), 1).Ready("s1").Started(t0.Add(-30 * time.Minute)).Obj(),
			},
			want: &etjobv1.CostStatus{Time: at(0), Rows: []etjobv1.CostRow{spot("0.91", 3600000), spot("1.2", 1800000)},
				WorkerHours: "1.500000", Cost: "1.510000", OnDemandCost: "4.590000"},
			wantNext: core.CostFlushInterval,
		},
		"a bill updated a minute ago, nothing else changed: no write, a look at the flush time": {
			prev: &etjobv1.CostStatus{Time: at(-time.Minute), Rows: []etjobv1.CostRow{spot("0.91", 3600000)}, WorkerHours: "1.000000", Cost: "0.910000", OnDemandCost: "3.060000"},
			pods: []*corev1.Pod{
				MakeWorker(job.Obj(), 0).Ready("s0").Started(t0.Add(-time.Hour)).Obj(),
				MakeWorker(job.Obj(), 1).Ready("s1").Started(t0.Add(-time.Hour)).Obj(),
			},
			want:     &etjobv1.CostStatus{Time: at(-time.Minute), Rows: []etjobv1.CostRow{spot("0.91", 3600000)}, WorkerHours: "1.000000", Cost: "0.910000", OnDemandCost: "3.060000"},
			wantNext: 4 * time.Minute,
		},
		"a bill CostFlushInterval old adds the time since, also of a pod that finished, to its end only": {
			prev: &etjobv1.CostStatus{Time: at(-core.CostFlushInterval), Rows: []etjobv1.CostRow{spot("0.91", 3600000), spot("1.2", 1000)}},
			pods: []*corev1.Pod{
				MakeWorker(job.Obj(), 0).Ready("s0").Started(t0.Add(-time.Hour)).Obj(),
				MakeWorker(job.Obj(), 1).Node("s1").Started(t0.Add(-time.Hour)).Exited(75, t0.Add(-4*time.Minute)).Obj(),
			},
			want: &etjobv1.CostStatus{Time: at(0), Rows: []etjobv1.CostRow{spot("0.91", 3600000+300000), spot("1.2", 1000+60000)},
				WorkerHours: "1.100278", Cost: "1.006167", OnDemandCost: "3.366850"},
			wantNext: core.CostFlushInterval,
		},
		"a pod whose node is gone adds nothing more; the hours of deleted pods stay": {
			prev: &etjobv1.CostStatus{Time: at(-core.CostFlushInterval), Rows: []etjobv1.CostRow{spot("1.2", 7200000)}},
			pods: []*corev1.Pod{
				MakeWorker(job.Obj(), 0).Ready("gone").Started(t0.Add(-time.Hour)).Obj(),
			},
			want: &etjobv1.CostStatus{Time: at(0), Rows: []etjobv1.CostRow{spot("1.2", 7200000)},
				WorkerHours: "2.000000", Cost: "2.400000", OnDemandCost: "6.120000"},
		},
		"an on-demand worker is its own on-demand price; a node without labels is on-demand at an unknown price, billed at 0": {
			pods: []*corev1.Pod{
				MakeWorker(job.Obj(), 0).Ready("od").Started(t0.Add(-time.Hour)).Obj(),
				MakeWorker(job.Obj(), 1).Ready("bare").Started(t0.Add(-time.Hour)).Obj(),
			},
			want: &etjobv1.CostStatus{Time: at(0), Rows: []etjobv1.CostRow{
				{CapacityType: "on-demand", Milliseconds: 3600000},
				{CapacityType: "on-demand", InstanceType: "p3.2xlarge", PricePerHour: "3.06", OnDemandPricePerHour: "3.06", Milliseconds: 3600000},
			}, WorkerHours: "2.000000", Cost: "3.060000"},
			wantNext: core.CostFlushInterval,
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			ns := map[string]*corev1.Node{"bare": MakeNode("bare").Obj()}
			for k, v := range nodes {
				ns[k] = v
			}
			st := running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: members, Cost: tc.prev})
			j := job.DeepCopy()
			j.Status = st
			// A settled status first (what the pass before wrote), with the
			// bill of the case: only the bill's own rules then say whether
			// it is brought up to date.
			// The launcher (a torchrun job's rendezvous store) is there: a job
			// with members and no launcher has lost its store (storeGone).
			pods := append([]*corev1.Pod{MakeLauncher(job.Obj()).Ready("od").Obj()}, tc.pods...)
			settled := core.Decide(core.Snapshot{Job: j, Pods: pods, Nodes: ns}, t0.Add(-10*time.Minute))
			j.Status = settled.Status
			j.Status.Cost = tc.prev
			plan := core.Decide(core.Snapshot{Job: j, Pods: pods, Nodes: ns}, t0)
			if diff := cmp.Diff(tc.want, plan.Status.Cost); diff != "" {
				t.Errorf("status.cost (-want +got):\n%s", diff)
			}
			if tc.wantNext != 0 && plan.RequeueAfter != tc.wantNext {
				t.Errorf("RequeueAfter = %s, want %s (the next flush)", plan.RequeueAfter, tc.wantNext)
			}
		})
	}
}

// TestBillPastMaxCostRows: a job on more prices than status.cost.rows may
// hold folds the rest into one row at their weighted price, and its totals
// stay right, also at the next update.
func TestBillPastMaxCostRows(t *testing.T) {
	job := base().Replicas(70).Max(70).Obj()
	nodes := map[string]*corev1.Node{"od": priced("od", etjobv1.CapacityTypeOnDemand, "3.06")}
	var pods []*corev1.Pod
	sum := 0.0
	for i := range int32(70) {
		name := fmt.Sprintf("s%d", i)
		price := fmt.Sprintf("%.2f", 0.5+float64(i)/100)
		nodes[name] = priced(name, etjobv1.CapacityTypeSpot, price)
		pods = append(pods, MakeWorker(job, i).Ready(name).Started(t0.Add(-time.Hour)).Obj())
		sum += 0.5 + float64(i)/100
	}
	job.Status = running(etjobv1.ElasticJobStatus{NextWorkerIndex: 70})
	for _, at := range []time.Duration{0, core.CostFlushInterval} {
		plan := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes}, t0.Add(at))
		c := plan.Status.Cost
		if c == nil || len(c.Rows) != core.MaxCostRows {
			t.Fatalf("at +%s: status.cost = %+v, want %d rows", at, c, core.MaxCostRows)
		}
		hours := (time.Hour + at).Hours()
		if got, _ := strconv.ParseFloat(c.Cost, 64); math.Abs(got-sum*hours) > 1e-4 {
			t.Errorf("at +%s: cost %v, want %v", at, got, sum*hours)
		}
		if got, _ := strconv.ParseFloat(c.OnDemandCost, 64); math.Abs(got-70*3.06*hours) > 1e-4 {
			t.Errorf("at +%s: on-demand cost %v, want %v", at, got, 70*3.06*hours)
		}
		job = job.DeepCopy()
		job.Status = plan.Status
	}
}

// TestBillAddsUp: however the passes fall (several a second, or minutes
// apart), the bill's worker time is the pods' own, start to end, to the
// millisecond, with the status stored as the API server stores it (a pod
// that ended is seen so by one pass, then it is gone). The
// first local run of the bill billed 1.7x: its time, stored in whole
// seconds, made every pass within a second bill that second again; billed
// up to the whole second, it lost up to a second of every pod's end (2.4 %
// in CI's run): now it is stored to the microsecond.
func TestBillAddsUp(t *testing.T) {
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 7))
		job := base().Replicas(4).Max(8).Obj()
		nodes := map[string]*corev1.Node{}
		type span struct{ start, end time.Time }
		var spans []span
		horizon := t0.Add(time.Hour)
		for i := range 8 {
			name := fmt.Sprintf("s%d", i)
			nodes[name] = priced(name, etjobv1.CapacityTypeSpot, "1")
			start := t0.Add(time.Duration(r.IntN(1800000)) * time.Millisecond)
			end := start.Add(time.Duration(1+r.IntN(3600000)) * time.Millisecond)
			spans = append(spans, span{start, end})
		}
		job.Status = running(etjobv1.ElasticJobStatus{NextWorkerIndex: 8})
		// A pod is seen ended by one pass, then it is gone (as a replaced
		// worker's pod is deleted): that pass must bill its end.
		gone := map[int]bool{}
		for now := t0; !now.After(horizon); now = now.Add(time.Duration(1+r.IntN([]int{900, 400000}[r.IntN(2)])) * time.Millisecond) {
			var pods []*corev1.Pod
			for i, sp := range spans {
				w := MakeWorker(job, int32(i))
				switch {
				case sp.start.After(now):
					continue
				case gone[i]:
					continue
				case !sp.end.After(now):
					w = w.Node(nodes[fmt.Sprintf("s%d", i)].Name).Started(sp.start).Exited(75, sp.end)
					gone[i] = true
				default:
					w = w.Ready(fmt.Sprintf("s%d", i)).Started(sp.start)
				}
				pods = append(pods, w.Obj())
			}
			plan := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes}, now)
			// Through JSON, as the API server stores it (metav1.Time in
			// whole seconds, MicroTime to the microsecond).
			raw, err := json.Marshal(plan.Status)
			if err != nil {
				t.Fatal(err)
			}
			job = job.DeepCopy()
			job.Status = etjobv1.ElasticJobStatus{}
			if err := json.Unmarshal(raw, &job.Status); err != nil {
				t.Fatal(err)
			}
		}
		// The last pass before the horizon billed up to it at most; the
		// time after the last pass is not billed yet.
		var got int64
		for _, row := range job.Status.Cost.Rows {
			got += row.Milliseconds
		}
		last := job.Status.Cost.Time.Time
		var upToLast time.Duration
		for _, sp := range spans {
			e := sp.end
			if e.After(last) {
				e = last
			}
			if e.After(sp.start) {
				upToLast += e.Sub(sp.start)
			}
		}
		if time.Duration(got)*time.Millisecond != upToLast {
			t.Errorf("seed %d: billed %s up to %s, the pods ran %s by then", seed, time.Duration(got)*time.Millisecond, last, upToLast)
		}
	}
}

// TestBillOnRestart: the pass that restarts the job (and so deletes every
// pod) bills the workers it deletes up to their end: the first CLI-story runs
// under a launcher move lost 13 s of four workers' time there.
func TestBillOnRestart(t *testing.T) {
	job := base().Replicas(2).RestartPolicy(etjobv1.RestartPolicyOnFailure).Obj()
	job.Status = running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2,
		Membership: etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}},
		Cost:       &etjobv1.CostStatus{Time: &metav1.MicroTime{Time: t0.Add(-10 * time.Minute)}}})
	nodes := map[string]*corev1.Node{
		"od": priced("od", etjobv1.CapacityTypeOnDemand, "3.06"),
		"s0": priced("s0", etjobv1.CapacityTypeSpot, "1"),
		"s1": priced("s1", etjobv1.CapacityTypeSpot, "1"),
	}
	pods := []*corev1.Pod{
		MakeLauncher(job).Node("od").Exited(1, t0.Add(-time.Minute)).Obj(),
		MakeWorker(job, 0).Ready("s0").Started(t0.Add(-time.Hour)).Obj(),
		MakeWorker(job, 1).Node("s1").Started(t0.Add(-time.Hour)).Exited(75, t0.Add(-5*time.Minute)).Obj(),
	}
	plan := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes}, t0)
	if plan.Status.Restarts != 1 || len(plan.Delete) != 3 {
		t.Fatalf("want the job restarted, every pod deleted: restarts %d, deletions %v", plan.Status.Restarts, plan.Delete)
	}
	c := plan.Status.Cost
	if c == nil || len(c.Rows) != 1 || c.Rows[0].Milliseconds != (10*time.Minute+5*time.Minute).Milliseconds() {
		t.Errorf("status.cost = %+v, want 10 min of worker 0 and 5 of worker 1", c)
	}
}

// TestBillIsTheSameEveryTime: Decide is pure, its bill too. Two on-demand
// nodes of one type at two prices once gave a spot row the on-demand price
// of whichever the node map yielded last, and two rows that differ only in
// their on-demand price came out in either order.
func TestBillIsTheSameEveryTime(t *testing.T) {
	job := base().Replicas(3).Obj()
	s0 := priced("s0", etjobv1.CapacityTypeSpot, "0.91")
	s0.Labels[etjobv1.LabelOnDemandPricePerHour] = "3.06"
	nodes := map[string]*corev1.Node{
		"s0": s0,
		"s1": priced("s1", etjobv1.CapacityTypeSpot, "0.91"),
		"a":  priced("a", etjobv1.CapacityTypeOnDemand, "3.06"),
		"b":  priced("b", etjobv1.CapacityTypeOnDemand, "2.5"),
		"c":  priced("c", etjobv1.CapacityTypeOnDemand, "2.8"),
	}
	pods := []*corev1.Pod{
		MakeWorker(job, 0).Ready("s0").Started(t0.Add(-time.Hour)).Obj(),
		MakeWorker(job, 1).Ready("s1").Started(t0.Add(-time.Hour)).Obj(),
	}
	spot := func(onDemand string) etjobv1.CostRow {
		return etjobv1.CostRow{CapacityType: "spot", InstanceType: "p3.2xlarge", PricePerHour: "0.91", OnDemandPricePerHour: onDemand, Milliseconds: 3600000}
	}
	// s1's type costs 2.5 on demand at the least: the bill never claims
	// more savings than the cheapest on-demand node of the type gives.
	want := []etjobv1.CostRow{spot("2.5"), spot("3.06")}
	for i := range 50 {
		got := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes}, t0).Status.Cost
		if diff := cmp.Diff(want, got.Rows); diff != "" {
			t.Fatalf("pass %d: rows (-want +got):\n%s", i, diff)
		}
		if got.OnDemandCost != "5.560000" {
			t.Fatalf("pass %d: onDemandCost %s, want 5.560000", i, got.OnDemandCost)
		}
	}
}
