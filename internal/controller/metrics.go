package controller

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// JobCollector exports every ElasticJob's state as Prometheus metrics, read
// from the controller's cache at each scrape: no reconcile keeps metric
// state, and a deleted job's series go with it. Only the leading replica
// exports them: every replica's cache holds every job, and two replicas'
// series would count each job twice (sum, count). The Grafana dashboard in
// the chart (charts/etjob/dashboards/etjob.json) plots them.
type JobCollector struct {
	reader  client.Reader
	elected <-chan struct{}
}

// NewJobCollector returns a collector that lists ElasticJobs from reader
// once elected is closed (the manager's Elected: at once without leader
// election).
func NewJobCollector(reader client.Reader, elected <-chan struct{}) *JobCollector {
	return &JobCollector{reader: reader, elected: elected}
}

// withLabels is the job labels and more, in a slice of its own.
func withLabels(more ...string) []string { return append(slices.Clone(jobLabels), more...) }

var (
	jobLabels = []string{"namespace", "job"}

	descInfo          = prometheus.NewDesc("etjob_job_info", "An ElasticJob and its framework (always 1).", withLabels("framework"), nil)
	descSpecReplicas  = prometheus.NewDesc("etjob_job_spec_replicas", "Workers the job asks for (spec.replicas).", jobLabels, nil)
	descMinReplicas   = prometheus.NewDesc("etjob_job_min_replicas", "Fewest workers the job trains with (spec.minReplicas); below it the job suspends.", jobLabels, nil)
	descMaxReplicas   = prometheus.NewDesc("etjob_job_max_replicas", "Most workers the job may grow to (spec.maxReplicas).", jobLabels, nil)
	descReplicas      = prometheus.NewDesc("etjob_job_replicas", "Worker pods that exist (status.replicas).", jobLabels, nil)
	descReady         = prometheus.NewDesc("etjob_job_ready_replicas", "Worker pods that are ready (status.readyReplicas).", jobLabels, nil)
	descMembers       = prometheus.NewDesc("etjob_job_members", "Workers in the published membership (status.members).", jobLabels, nil)
	descLeaving       = prometheus.NewDesc("etjob_job_leaving_replicas", "Workers told to leave, checkpointing (status.leavingReplicas).", jobLabels, nil)
	descWorkers       = prometheus.NewDesc("etjob_job_workers", "Workers by state (status.workers).", withLabels("state"), nil)
	descCondition     = prometheus.NewDesc("etjob_job_condition", "1 when the job's condition is True, else 0.", withLabels("condition"), nil)
	descGeneration    = prometheus.NewDesc("etjob_job_membership_generation", "The membership's generation: each change of the worker set adds one.", jobLabels, nil)
	descRestarts      = prometheus.NewDesc("etjob_job_restarts_total", "Whole-job restarts (status.restarts).", jobLabels, nil)
	descFailures      = prometheus.NewDesc("etjob_job_failures_total", "Worker failures counted against the backoff limit (status.failures).", jobLabels, nil)
	descPreemptions   = prometheus.NewDesc("etjob_job_preemptions_total", "Workers taken by spot reclamations (status.preemptions).", jobLabels, nil)
	descCkptStep      = prometheus.NewDesc("etjob_job_last_checkpoint_step", "The step of the last checkpoint the workers reported.", jobLabels, nil)
	descCkptTime      = prometheus.NewDesc("etjob_job_last_checkpoint_timestamp_seconds", "When the last checkpoint was written (Unix time).", jobLabels, nil)
	descCkptDuration  = prometheus.NewDesc("etjob_job_last_checkpoint_duration_seconds", "How long the last checkpoint took to write.", jobLabels, nil)
	descStart         = prometheus.NewDesc("etjob_job_start_timestamp_seconds", "When the job first ran (Unix time).", jobLabels, nil)
	descWorkerSeconds = prometheus.NewDesc("etjob_job_worker_seconds_total", "Worker time the job ran, by capacity type and price (status.cost).", withLabels("capacity_type", "price_per_hour"), nil)
	descCost          = prometheus.NewDesc("etjob_job_cost_dollars_total", "What the job's workers cost, in US dollars (status.cost.cost).", jobLabels, nil)
	descOnDemandCost  = prometheus.NewDesc("etjob_job_on_demand_cost_dollars_total", "What the same worker hours cost on demand, in US dollars (status.cost.onDemandCost).", jobLabels, nil)

	jobDescs = []*prometheus.Desc{descInfo, descSpecReplicas, descMinReplicas, descMaxReplicas, descReplicas, descReady,
		descMembers, descLeaving, descWorkers, descCondition, descGeneration, descRestarts, descFailures, descPreemptions,
		descCkptStep, descCkptTime, descCkptDuration, descStart, descWorkerSeconds, descCost, descOnDemandCost}

	jobConditions = []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing, etjobv1.ConditionSuspended,
		etjobv1.ConditionComplete, etjobv1.ConditionFailed, etjobv1.ConditionCheckpointTooSlow, etjobv1.ConditionCreateRefused,
		etjobv1.ConditionTrainingStalled}
)

// Describe sends every metric's description.
func (c *JobCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range jobDescs {
		ch <- d
	}
}

// Collect lists the jobs and sends their metrics, on the leader only; a
// failed list sends an invalid metric, which fails the scrape rather than
// report nothing. The jobs are the cache's own objects (only read here).
func (c *JobCollector) Collect(ch chan<- prometheus.Metric) {
	select {
	case <-c.elected:
	default:
		return // a standby replica
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var jobs etjobv1.ElasticJobList
	if err := c.reader.List(ctx, &jobs, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(descInfo, err)
		return
	}
	for i := range jobs.Items {
		collectJob(ch, &jobs.Items[i])
	}
}

func collectJob(ch chan<- prometheus.Metric, j *etjobv1.ElasticJob) {
	l := []string{j.Namespace, j.Name}
	gauge := func(d *prometheus.Desc, v float64, extra ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(slices.Clone(l), extra...)...)
	}
	counter := func(d *prometheus.Desc, v int32) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	s := &j.Status
	gauge(descInfo, 1, string(j.Spec.Framework))
	gauge(descSpecReplicas, float64(j.Spec.Replicas))
	gauge(descMinReplicas, float64(j.Spec.MinReplicas))
	gauge(descMaxReplicas, float64(j.Spec.MaxReplicas))
	gauge(descReplicas, float64(s.Replicas))
	gauge(descReady, float64(s.ReadyReplicas))
	gauge(descMembers, float64(s.Members))
	gauge(descLeaving, float64(s.LeavingReplicas))
	gauge(descGeneration, float64(s.Membership.Generation))
	states := map[string]int{}
	for _, w := range s.Workers {
		states[string(w.State)]++
	}
	for state, n := range states {
		gauge(descWorkers, float64(n), state)
	}
	for _, cond := range jobConditions {
		v := 0.0
		if meta.IsStatusConditionTrue(s.Conditions, cond) {
			v = 1
		}
		gauge(descCondition, v, cond)
	}
	counter(descRestarts, s.Restarts)
	counter(descFailures, s.Failures)
	counter(descPreemptions, s.Preemptions)
	if ck := s.LastCheckpoint; ck != nil {
		gauge(descCkptStep, float64(ck.Step))
		if ck.Time != nil {
			gauge(descCkptTime, float64(ck.Time.Unix()))
		}
		gauge(descCkptDuration, float64(ck.DurationMilliseconds)/1000)
	}
	if s.StartTime != nil {
		gauge(descStart, float64(s.StartTime.Unix()))
	}
	if c := s.Cost; c != nil {
		total := func(d *prometheus.Desc, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append(slices.Clone(l), extra...)...)
		}
		hours := map[[2]string]float64{}
		for _, r := range c.Rows {
			hours[[2]string{r.CapacityType, r.PricePerHour}] += float64(r.Milliseconds) / 1000
		}
		for k, h := range hours {
			total(descWorkerSeconds, h, k[0], k[1])
		}
		if v, err := strconv.ParseFloat(c.Cost, 64); err == nil {
			total(descCost, v)
		}
		if v, err := strconv.ParseFloat(c.OnDemandCost, 64); err == nil {
			total(descOnDemandCost, v)
		}
	}
}
