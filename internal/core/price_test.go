package core_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

// TestDecideBudget runs the rules of spec.spot.budgetPerHour (price.go). Two
// workers run on n0 and n1 (0.5 an hour each, unless a case changes n1); the
// cluster also has an unpriced on-demand node, a cheap node (0.4), a dear one
// (0.8) and a pricey one (3).
func TestDecideBudget(t *testing.T) {
	jobWith := func(budget string) *etjobv1.ElasticJob {
		return MakeElasticJob("j", "ns").Replicas(4).Min(1).Max(4).Spot(etjobv1.SpotSpec{Enabled: true, BudgetPerHour: budget, LeaveGracePeriodSeconds: 30}).
			Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: etjobv1.MembershipStatus{Generation: 3, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj()
	}
	priced := func(n1 string) map[string]*corev1.Node {
		ns := nodes("od")
		for name, price := range map[string]string{"n0": "0.5", "n1": n1, "cheap": "0.4", "dear": "0.8", "pricey": "3"} {
			ns[name] = MakeNode(name).Label(etjobv1.LabelPricePerHour, price).Obj()
		}
		return ns
	}
	decide := func(job *etjobv1.ElasticJob, n1 string, more ...*corev1.Pod) core.Plan {
		pods := append([]*corev1.Pod{MakeLauncher(job).Ready("od").Obj(), MakeWorker(job, 0).Ready("n0").Obj(), MakeWorker(job, 1).Ready("n1").Obj()}, more...)
		return core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: priced(n1)}, t0)
	}

	t.Run("the budget left buys new workers at the cheapest node, each kept off nodes dearer than its share", func(t *testing.T) {
		// 2.0 - 1.0 = 1.0 left: two at 0.4; a share of 0.5 each.
		plan := decide(jobWith("2.0"), "0.5")
		if diff := cmp.Diff([]int32{2, 3}, plan.CreateWorkers); diff != "" {
			t.Errorf("CreateWorkers (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"dear", "pricey"}, plan.AvoidNodes); diff != "" {
			t.Errorf("AvoidNodes (-want +got):\n%s", diff)
		}
		if len(plan.Signal) != 0 {
			t.Errorf("signals %+v, want none", plan.Signal)
		}
	})
	t.Run("a short budget starts fewer workers, says why, and looks again", func(t *testing.T) {
		// 1.5 - 1.0 = 0.5 left: one at 0.4, with a share of 0.5.
		plan := decide(jobWith("1.5"), "0.5")
		if diff := cmp.Diff([]int32{2}, plan.CreateWorkers); diff != "" {
			t.Errorf("CreateWorkers (-want +got):\n%s", diff)
		}
		c := meta.FindStatusCondition(plan.Status.Conditions, etjobv1.ConditionResizing)
		if c == nil || c.Reason != etjobv1.ReasonOverBudget || c.Message != "3 of 4 workers: spec.spot.budgetPerHour 1.5 leaves 0.5 an hour for new ones" {
			t.Errorf("Resizing = %+v, want reason %s naming the budget", c, etjobv1.ReasonOverBudget)
		}
		if plan.RequeueAfter <= 0 || plan.RequeueAfter > core.BudgetRecheck {
			t.Errorf("RequeueAfter %v, want at most %v", plan.RequeueAfter, core.BudgetRecheck)
		}
	})
	t.Run("a budget that buys a whole pass's creates does not hold the job", func(t *testing.T) {
		// 4.2 - 1.0 = 3.2 left buys 8 at 0.4, as many as one pass creates
		// (MaxCreatesPerPass): the rest come next pass, not for the budget.
		job := jobWith("4.2")
		job.Spec.Replicas, job.Spec.MaxReplicas = 12, 12
		plan := decide(job, "0.5")
		if len(plan.CreateWorkers) != int(core.MaxCreatesPerPass) {
			t.Errorf("CreateWorkers %v, want %d", plan.CreateWorkers, core.MaxCreatesPerPass)
		}
		if c := meta.FindStatusCondition(plan.Status.Conditions, etjobv1.ConditionResizing); c == nil || c.Reason == etjobv1.ReasonOverBudget {
			t.Errorf("Resizing = %+v, want a reason other than %s", c, etjobv1.ReasonOverBudget)
		}
	})
	t.Run("an unscheduled worker counts against the budget left", func(t *testing.T) {
		// 1.0 left, one at 0.4 already pending: one more, sharing 0.5 each.
		job := jobWith("2.0")
		job.Status.NextWorkerIndex = 3
		plan := decide(job, "0.5", MakeWorker(job, 2).Obj())
		if diff := cmp.Diff([]int32{3}, plan.CreateWorkers); diff != "" {
			t.Errorf("CreateWorkers (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"dear", "pricey"}, plan.AvoidNodes); diff != "" {
			t.Errorf("AvoidNodes (-want +got):\n%s", diff)
		}
	})
	t.Run("nothing left: no new worker", func(t *testing.T) {
		plan := decide(jobWith("1.0"), "0.5")
		if len(plan.CreateWorkers) != 0 || len(plan.Signal) != 0 {
			t.Errorf("creates %v, signals %+v; want none", plan.CreateWorkers, plan.Signal)
		}
	})
	t.Run("a price rise above the budget makes the dearest worker leave at an agreed step, replaced on a cheaper node", func(t *testing.T) {
		// n1 at 1.0: 1.5 > 1.2, worker 1 leaves; 0.7 left buys one at 0.4,
		// kept off n1, dear and pricey.
		plan := decide(jobWith("1.2"), "1.0")
		if len(plan.Signal) != 1 || plan.Signal[0].Pod != "j-worker-1" || plan.Signal[0].Reason != etjobv1.ReasonOverBudget {
			t.Fatalf("signals %+v, want j-worker-1 told to leave for %s", plan.Signal, etjobv1.ReasonOverBudget)
		}
		if diff := cmp.Diff([]int32{2}, plan.CreateWorkers); diff != "" {
			t.Errorf("CreateWorkers (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"dear", "n1", "pricey"}, plan.AvoidNodes); diff != "" {
			t.Errorf("AvoidNodes (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"j-worker-0:1"}, plan.Status.Membership.Hosts); diff != "" {
			t.Errorf("hosts (-want +got):\n%s", diff)
		}
	})
	t.Run("the dearest leave until the spend fits", func(t *testing.T) {
		plan := decide(jobWith("0.4"), "0.6")
		var got []string
		for _, s := range plan.Signal {
			if s.Reason == etjobv1.ReasonOverBudget {
				got = append(got, s.Pod)
			}
		}
		if diff := cmp.Diff([]string{"j-worker-1", "j-worker-0"}, got); diff != "" {
			t.Errorf("told to leave for the budget (-want +got):\n%s", diff)
		}
	})
	t.Run("a worker that left for the budget is a release", func(t *testing.T) {
		job := jobWith("1.2")
		w1 := MakeWorker(job, 1).Ready("n1").Told(t0.Add(-time.Minute), etjobv1.ReasonOverBudget).Exited(etjobv1.ExitCodePreempted, t0.Add(-time.Second)).Obj()
		plan := core.Decide(core.Snapshot{Job: job, Pods: []*corev1.Pod{MakeLauncher(job).Ready("od").Obj(), MakeWorker(job, 0).Ready("n0").Obj(), w1},
			Nodes: priced("1.0")}, t0)
		if plan.Status.Preemptions != 0 || plan.Status.Failures != 0 {
			t.Errorf("preemptions/failures %d/%d, want 0/0", plan.Status.Preemptions, plan.Status.Failures)
		}
	})
	t.Run("without a budget prices do not bound the size", func(t *testing.T) {
		plan := decide(jobWith(""), "9")
		if diff := cmp.Diff([]int32{2, 3}, plan.CreateWorkers); diff != "" {
			t.Errorf("CreateWorkers (-want +got):\n%s", diff)
		}
		if len(plan.Signal) != 0 || plan.AvoidNodes != nil {
			t.Errorf("signals %+v, avoid %v; want none", plan.Signal, plan.AvoidNodes)
		}
	})
}

// TestDecidePriceTable (issue #26, N7): a rooted node that claims to be the
// cheapest (its own etjob.dev/price-per-hour, which its agent writes) draws
// a budget job's new workers: without a price table every new worker's
// share fits only it, and the dearer honest nodes are avoided. Under the
// admin's table its claim cannot lower its row's price: the budget buys
// what the table's prices buy, and the claimant is avoided like any node
// dearer than a share.
func TestDecidePriceTable(t *testing.T) {
	job := MakeElasticJob("j", "ns").Replicas(6).Min(1).Max(6).Spot(etjobv1.SpotSpec{Enabled: true, BudgetPerHour: "2.0", LeaveGracePeriodSeconds: 30}).
		Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 1, Membership: etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1"}}})).Obj()
	typed := func(name, instance, own string) *corev1.Node {
		return MakeNode(name).Label(etjobv1.LabelInstanceType, instance).Label(etjobv1.LabelCapacityType, etjobv1.CapacityTypeSpot).
			Label(etjobv1.LabelPricePerHour, own).Obj()
	}
	ns := nodes("od")
	ns["n0"] = typed("n0", "g5.xlarge", "0.5")
	ns["honest"] = typed("honest", "g5.xlarge", "0.5")
	ns["rooted"] = typed("rooted", "g5.xlarge", "0.01")
	pods := []*corev1.Pod{MakeLauncher(job).Ready("od").Obj(), MakeWorker(job, 0).Ready("n0").Obj()}
	table, err := etjobv1.ParsePriceTable("g5.xlarge spot 0.5\ng5.xlarge on-demand 1.0\n")
	if err != nil {
		t.Fatal(err)
	}

	trusting := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: ns}, t0)
	// 1.5 left at 0.01 buys all 5; a share of 0.3 each keeps them off
	// every honest node: only the claimant fits.
	if diff := cmp.Diff([]string{"honest", "n0"}, trusting.AvoidNodes); diff != "" {
		t.Errorf("without a table, AvoidNodes (-want +got):\n%s", diff)
	}
	if len(trusting.CreateWorkers) != 5 {
		t.Errorf("without a table, CreateWorkers %v, want the 5 the forged price buys", trusting.CreateWorkers)
	}

	plan := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: ns, Prices: table}, t0)
	// 1.5 left at the table's 0.5 buys 3, with a share of 0.5 each: every
	// g5.xlarge fits; the launcher's node, of a type the table does not
	// list, costs its dearest (1.0) and is avoided.
	if diff := cmp.Diff([]int32{1, 2, 3}, plan.CreateWorkers); diff != "" {
		t.Errorf("under the table, CreateWorkers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"od"}, plan.AvoidNodes); diff != "" {
		t.Errorf("under the table, AvoidNodes (-want +got):\n%s", diff)
	}
}

func typedNode(instance, capacity, own string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{
		etjobv1.LabelInstanceType: instance, etjobv1.LabelCapacityType: capacity}}}
	if own != "" {
		n.Annotations = map[string]string{etjobv1.AnnotationPricePerHour: own}
	}
	return n
}

// TestNodePrice (issue #26, N7): under the admin's table a node's own price
// can raise its row's price, never lower it; a node the table does not list
// costs the dearest row; without a table the node's own price stands.
func TestNodePrice(t *testing.T) {
	table, err := etjobv1.ParsePriceTable("p4d.24xlarge spot 9.83\np4d.24xlarge on-demand 32.77\ng5.xlarge spot 0.40\n")
	if err != nil {
		t.Fatal(err)
	}
	keyed := &etjobv1.PriceTable{Prices: table.Prices, KeyLabelPrefix: "node-restriction.kubernetes.io/etjob-"}
	trusted := func(n *corev1.Node, instance, capacity string) *corev1.Node {
		n.Labels[keyed.KeyLabelPrefix+etjobv1.PriceKeyInstanceType] = instance
		if capacity != "" {
			n.Labels[keyed.KeyLabelPrefix+etjobv1.PriceKeyCapacityType] = capacity
		}
		return n
	}
	for name, tc := range map[string]struct {
		table  *etjobv1.PriceTable
		node   *corev1.Node
		want   etjobv1.PricePerHour
		wantOK bool
	}{
		"a rooted node claims to be cheap": {table, typedNode("p4d.24xlarge", "spot", "0.01"), 9.83, true},
		"the spot market rose":             {table, typedNode("p4d.24xlarge", "spot", "12.5"), 12.5, true},
		"no price of its own":              {table, typedNode("g5.xlarge", "spot", ""), 0.40, true},
		"on demand":                        {table, typedNode("p4d.24xlarge", "on-demand", "1"), 32.77, true},
		"a type the table does not list":   {table, typedNode("made-up.nano", "spot", "0.001"), 32.77, true},
		"no table: the node's own":         {nil, typedNode("p4d.24xlarge", "spot", "0.01"), 0.01, true},
		"no table, no price":               {nil, typedNode("p4d.24xlarge", "spot", ""), 0, false},
		// issue #42, H2: rows by the admin's labels, which a kubelet cannot set
		"a rooted node relabels itself as a cheaper type": {keyed, trusted(typedNode("g5.xlarge", "spot", ""), "p4d.24xlarge", "spot"), 9.83, true},
		"as on demand":                   {keyed, trusted(typedNode("p4d.24xlarge", "spot", ""), "p4d.24xlarge", "on-demand"), 32.77, true},
		"no admin's labels: the dearest": {keyed, typedNode("g5.xlarge", "spot", ""), 32.77, true},
		"only one of the admin's labels": {keyed, trusted(typedNode("g5.xlarge", "spot", ""), "g5.xlarge", ""), 32.77, true},
		// issue #42, M5: a table required and absent has no rows: no node
		// has a price, its own claim included
		"a required table absent: a rooted node claims to be cheap": {&etjobv1.PriceTable{}, typedNode("p4d.24xlarge", "spot", "0.01"), 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := core.NodePrice(tc.table, tc.node)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("NodePrice = %v, %v; want %v, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}
