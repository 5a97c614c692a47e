package controller

import (
	"io/fs"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/charts"
	"github.com/etjob/etjob/internal/scheme"
)

func metricsJob() *etjobv1.ElasticJob {
	now := metav1.NewTime(time.Unix(1_800_000_000, 0))
	return &etjobv1.ElasticJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "digits"},
		Spec:       etjobv1.ElasticJobSpec{Replicas: 4, MinReplicas: 2, MaxReplicas: 8, Framework: etjobv1.FrameworkTorchrun},
		Status: etjobv1.ElasticJobStatus{
			Replicas: 3, ReadyReplicas: 3, Members: 3, LeavingReplicas: 1, Preemptions: 2, Failures: 1,
			Membership: etjobv1.MembershipStatus{Generation: 5},
			Workers: []etjobv1.WorkerStatus{{Name: "w0", State: etjobv1.WorkerMember}, {Name: "w1", State: etjobv1.WorkerMember},
				{Name: "w2", State: etjobv1.WorkerLeaving}},
			Conditions:     []metav1.Condition{{Type: etjobv1.ConditionRunning, Status: metav1.ConditionTrue, Reason: "Training", LastTransitionTime: now}},
			LastCheckpoint: &etjobv1.CheckpointStatus{Step: 1200, Time: &now, DurationMilliseconds: 1500},
			Cost: &etjobv1.CostStatus{Time: &metav1.MicroTime{Time: now.Time}, Rows: []etjobv1.CostRow{{CapacityType: "spot", PricePerHour: "0.91", OnDemandPricePerHour: "3.06", Milliseconds: 5400000}},
				WorkerHours: "1.500000", Cost: "1.365000", OnDemandCost: "4.590000"},
			StartTime: &now,
		},
	}
}

// TestJobCollector: each job's status becomes its series, read from the
// cache at the scrape.
func TestJobCollector(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(metricsJob()).Build()
	col := NewJobCollector(c, elected())
	want := `
# HELP etjob_job_members Workers in the published membership (status.members).
# TYPE etjob_job_members gauge
etjob_job_members{job="digits",namespace="team-a"} 3
# HELP etjob_job_preemptions_total Workers taken by spot reclamations (status.preemptions).
# TYPE etjob_job_preemptions_total counter
etjob_job_preemptions_total{job="digits",namespace="team-a"} 2
# HELP etjob_job_workers Workers by state (status.workers).
# TYPE etjob_job_workers gauge
etjob_job_workers{job="digits",namespace="team-a",state="Leaving"} 1
etjob_job_workers{job="digits",namespace="team-a",state="Member"} 2
# HELP etjob_job_last_checkpoint_duration_seconds How long the last checkpoint took to write.
# TYPE etjob_job_last_checkpoint_duration_seconds gauge
etjob_job_last_checkpoint_duration_seconds{job="digits",namespace="team-a"} 1.5
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want), "etjob_job_members", "etjob_job_preemptions_total",
		"etjob_job_workers", "etjob_job_last_checkpoint_duration_seconds"); err != nil {
		t.Error(err)
	}
	if err := testutil.CollectAndCompare(col, strings.NewReader(`
# HELP etjob_job_condition 1 when the job's condition is True, else 0.
# TYPE etjob_job_condition gauge
etjob_job_condition{condition="CheckpointTooSlow",job="digits",namespace="team-a"} 0
etjob_job_condition{condition="Complete",job="digits",namespace="team-a"} 0
etjob_job_condition{condition="CreateRefused",job="digits",namespace="team-a"} 0
etjob_job_condition{condition="Failed",job="digits",namespace="team-a"} 0
etjob_job_condition{condition="Resizing",job="digits",namespace="team-a"} 0
etjob_job_condition{condition="Running",job="digits",namespace="team-a"} 1
etjob_job_condition{condition="Suspended",job="digits",namespace="team-a"} 0
etjob_job_condition{condition="TrainingStalled",job="digits",namespace="team-a"} 0
`), "etjob_job_condition"); err != nil {
		t.Error(err)
	}
	if err := testutil.CollectAndCompare(col, strings.NewReader(`
# HELP etjob_job_cost_dollars_total What the job's workers cost, in US dollars (status.cost.cost).
# TYPE etjob_job_cost_dollars_total counter
etjob_job_cost_dollars_total{job="digits",namespace="team-a"} 1.365
# HELP etjob_job_worker_seconds_total Worker time the job ran, by capacity type and price (status.cost).
# TYPE etjob_job_worker_seconds_total counter
etjob_job_worker_seconds_total{capacity_type="spot",job="digits",namespace="team-a",price_per_hour="0.91"} 5400
`), "etjob_job_cost_dollars_total", "etjob_job_worker_seconds_total"); err != nil {
		t.Error(err)
	}
	if lint, err := testutil.CollectAndLint(col); err != nil || len(lint) > 0 {
		t.Errorf("metrics lint: %v %v", err, lint)
	}
}

// elected is a closed election channel: this replica leads.
func elected() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// TestJobCollectorStandby: a replica that does not lead exports no job
// series, so two replicas never count a job twice; once elected, it does.
func TestJobCollectorStandby(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(metricsJob()).Build()
	ch := make(chan struct{})
	col := NewJobCollector(c, ch)
	if n := testutil.CollectAndCount(col); n != 0 {
		t.Errorf("a standby replica exported %d job series", n)
	}
	close(ch)
	if n := testutil.CollectAndCount(col, "etjob_job_info"); n != 1 {
		t.Errorf("the leader exported %d etjob_job_info series, want 1", n)
	}
}

// TestDashboardPlotsExportedMetrics: every etjob_ series the chart's Grafana
// dashboard queries is one the collector exports.
func TestDashboardPlotsExportedMetrics(t *testing.T) {
	raw, err := fs.ReadFile(charts.Etjob(), "dashboards/etjob.json")
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(metricsJob()).Build()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewJobCollector(c, elected()))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
	}
	var queried []string
	for _, m := range regexp.MustCompile(`etjob_[a-z_]+`).FindAllString(string(raw), -1) {
		if !exported[m] {
			queried = append(queried, m)
		}
	}
	sort.Strings(queried)
	if len(queried) > 0 {
		t.Errorf("the dashboard queries series the controller does not export: %v", queried)
	}
	if len(exported) < 10 {
		t.Errorf("only %d job metrics exported", len(exported))
	}
}
