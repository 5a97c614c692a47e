package core

import (
	"fmt"
	"slices"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Growth above spec.replicas (spec.growth.policy Opportunistic): the job
// aims for spec.replicas base workers and adds extra workers, up to
// spec.maxReplicas, while they are scheduled on free capacity. Extra workers
// run at a lower PriorityClass (render.PlannedWorker), so the scheduler's own
// preemption takes them first for anyone else's pods; the job sees that as a
// DisruptionTarget notice and lets the worker go at an agreed step.
//
// The rules, in the order growthRoom applies them:
//   - a job queued by Kueue grows no further than it was admitted (replicas);
//   - base workers come first: no probe while the base is short;
//   - the throughput rule: no more workers than the size past which the
//     measured samples/s gained less than minSamplesPerSecondPerWorker per
//     added worker;
//   - probes are bounded: one batch at a time (none while any worker waits
//     to be scheduled), an extra worker unscheduled for probeTimeoutSeconds
//     is given up, and after that, or after an extra worker was taken back,
//     no probe for backoffSeconds.

// MaxThroughputPoints bounds status.growth.throughput (the CRD's MaxItems).
const MaxThroughputPoints = 32

// Opportunistic reports whether the job grows above spec.replicas.
func Opportunistic(spec *etjobv1.ElasticJobSpec) bool {
	return spec.Growth != nil && spec.Growth.Policy == etjobv1.GrowthOpportunistic
}

func probeTimeout(spec *etjobv1.ElasticJobSpec) time.Duration {
	if g := spec.Growth; g != nil && g.ProbeTimeoutSeconds > 0 {
		return time.Duration(g.ProbeTimeoutSeconds) * time.Second
	}
	return 120 * time.Second
}

func growthBackoff(spec *etjobv1.ElasticJobSpec) time.Duration {
	if g := spec.Growth; g != nil {
		return time.Duration(g.BackoffSeconds) * time.Second
	}
	return 300 * time.Second
}

// growth is what one pass decided about extra workers.
type growth struct {
	// room is how many extra workers the job may have after this pass.
	room int32
	// probe: room may be filled with new extra workers.
	probe bool
	// reason says what holds the job at its size (status.growth.reason).
	reason string
}

// growthRoom decides how many extra workers the job may have, given its
// active base and extra workers, and gives up the probes that timed out.
func (d *decision) growthRoom(desired int32, base, extra []*podView) growth {
	if !Opportunistic(d.spec) {
		d.growth = nil
		return growth{}
	}
	g := d.growthStatus()
	d.measureThroughput(g)
	d.noteTakenBack(g)
	_, queued := d.job.Labels[etjobv1.LabelKueueQueue]
	limit, reason := growthLimit(d.spec, desired, queued, g.Throughput)
	room := max(limit-desired, 0)
	for _, w := range extra {
		if !w.scheduled && !d.deleted[w.pod.Name] && !d.now.Before(w.pod.CreationTimestamp.Add(probeTimeout(d.spec))) {
			d.delete(w, etjobv1.ReasonGrowth)
			d.record(etjobv1.TimelineScale, fmt.Sprintf("extra worker %s not scheduled within %s: given up", w.pod.Name, probeTimeout(d.spec)))
			d.backoff(g, d.now)
		}
	}
	out := growth{room: room, probe: true}
	switch {
	case int32(len(base)) < desired:
		out.probe, out.reason = false, "Replicas"
	case g.BackoffUntil != nil && d.now.Before(g.BackoffUntil.Time):
		out.probe, out.reason = false, "Backoff"
		d.requeueAt(g.BackoffUntil.Time)
	case slices.ContainsFunc(d.workers, func(w *podView) bool { return w.active() && !w.scheduled && !d.deleted[w.pod.Name] }):
		out.probe, out.reason = false, "Probing"
	}
	if !out.probe {
		// Keep the extra workers there are; make no new ones.
		out.room = min(room, int32(len(extra)))
	}
	if out.room == room {
		out.reason = reason
	}
	for _, w := range extra {
		if !w.scheduled && !d.deleted[w.pod.Name] {
			d.requeueAt(w.pod.CreationTimestamp.Add(probeTimeout(d.spec)))
		}
	}
	g.Limit, g.Reason = desired+room, out.reason
	return out
}

// growthLimit is the size growth may reach and what sets it: maxReplicas;
// desired for a job that Kueue admitted (its quota covers spec.replicas
// only); or the size past which the measured throughput gained too little.
func growthLimit(spec *etjobv1.ElasticJobSpec, desired int32, queued bool, throughput []etjobv1.ThroughputPoint) (int32, string) {
	limit, reason := spec.MaxReplicas, "MaxReplicas"
	if queued {
		return desired, "Admitted"
	}
	if t, ok := throughputLimit(throughput, spec.Growth.MinSamplesPerSecondPerWorker); ok && t < limit {
		limit, reason = max(t, desired), "Throughput"
	}
	return limit, reason
}

// growthStatus is status.growth, created on first use.
func (d *decision) growthStatus() *etjobv1.GrowthStatus {
	if d.growth == nil {
		d.growth = &etjobv1.GrowthStatus{}
	}
	return d.growth
}

// backoff holds new probes until from + backoffSeconds (never earlier than
// an earlier backoff did).
func (d *decision) backoff(g *etjobv1.GrowthStatus, from time.Time) {
	until := from.Add(growthBackoff(d.spec))
	if g.BackoffUntil == nil || g.BackoffUntil.Time.Before(until) {
		g.BackoffUntil = &metav1.Time{Time: until.Truncate(time.Second)}
	}
}

// noteTakenBack backs off after an extra worker was taken back (a notice,
// the scheduler's preemption, a lost node): the capacity is wanted. The
// backoff counts from when the worker was told to leave, so every pass that
// sees it again decides the same.
func (d *decision) noteTakenBack(g *etjobv1.GrowthStatus) {
	for _, w := range d.workers {
		if !w.extra || !(w.noticed || w.lost || w.preempted) {
			continue
		}
		from := w.leaveAt
		if from.IsZero() {
			from = d.now
		}
		d.backoff(g, from)
	}
}

// measureThroughput records the job's throughput at the sizes it was
// measured with: the samples/s its members reported with their checkpoints
// since the membership last changed, added up by the world size each report
// says it was measured at (the membership's size when it does not say). A
// worker reports its own share, or rank 0 alone reports the whole job's
// (the worker library's convention); either way the sum is the job's. The
// size matters: the checkpoint of a stop, written after the change, reports
// the throughput of the size before it (found by the simulator: taken as
// the new size's, a step up looked like no gain, and growth stopped).
func (d *decision) measureThroughput(g *etjobv1.GrowthStatus) {
	g.Throughput = throughputPoints(g.Throughput, d.s.Job.Status.Membership, d.workers)
}

// throughputPoints is measureThroughput as a function: the points known
// (pts), updated with what the ready active workers reported since the
// membership m last changed.
func throughputPoints(pts []etjobv1.ThroughputPoint, m etjobv1.MembershipStatus, workers []*podView) []etjobv1.ThroughputPoint {
	if m.ChangeTime == nil || len(m.Hosts) == 0 {
		return pts
	}
	sums := map[int32]float64{}
	for _, w := range workers {
		c := w.checkpoint
		if !w.ready || !w.active() || c == nil || c.SamplesPerSecond <= 0 {
			continue
		}
		if t, err := time.Parse(time.RFC3339, c.Time); err == nil && !t.Before(m.ChangeTime.Time) {
			n := c.Workers
			if n <= 0 {
				n = int32(len(m.Hosts))
			}
			sums[n] += c.SamplesPerSecond
		}
	}
	if len(sums) == 0 {
		return pts
	}
	out := slices.DeleteFunc(slices.Clone(pts), func(q etjobv1.ThroughputPoint) bool { _, ok := sums[q.Workers]; return ok })
	for n, sum := range sums {
		out = append(out, etjobv1.ThroughputPoint{Workers: n, SamplesPerSecond: int64(sum + 0.5)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Workers < out[j].Workers })
	if len(out) > MaxThroughputPoints {
		out = out[len(out)-MaxThroughputPoints:]
	}
	return out
}

// throughputLimit is the size past which adding workers gained less than
// minGain samples/s per worker: the smaller size of the first step up whose
// gain falls short. ok is false when the rule is off or nothing fell short.
func throughputLimit(pts []etjobv1.ThroughputPoint, minGain int64) (int32, bool) {
	if minGain <= 0 {
		return 0, false
	}
	for i := 1; i < len(pts); i++ {
		a, b := pts[i-1], pts[i]
		gain := float64(b.SamplesPerSecond-a.SamplesPerSecond) / float64(b.Workers-a.Workers)
		if gain < float64(minGain) {
			return a.Workers, true
		}
	}
	return 0, false
}
