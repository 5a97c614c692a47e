package core

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Growth's rules as functions. Decide's tables (growth_test.go) keep the
// stories across policies.

func TestGrowthLimit(t *testing.T) {
	spec := &etjobv1.ElasticJobSpec{MaxReplicas: 8, Growth: &etjobv1.GrowthSpec{MinSamplesPerSecondPerWorker: 50}}
	flat := []etjobv1.ThroughputPoint{{Workers: 4, SamplesPerSecond: 400}, {Workers: 6, SamplesPerSecond: 500}} // +50/worker: enough
	worse := []etjobv1.ThroughputPoint{{Workers: 4, SamplesPerSecond: 400}, {Workers: 6, SamplesPerSecond: 420}, {Workers: 7, SamplesPerSecond: 700}}
	for _, c := range []struct {
		name   string
		queued bool
		points []etjobv1.ThroughputPoint
		limit  int32
		reason string
	}{
		{"nothing measured: maxReplicas", false, nil, 8, "MaxReplicas"},
		{"every step gained enough", false, flat, 8, "MaxReplicas"},
		{"4 to 6 gained 10 a worker: held at 4", false, worse, 4, "Throughput"},
		{"admitted by Kueue: desired", true, flat, 3, "Admitted"},
	} {
		if limit, reason := growthLimit(spec, 3, c.queued, c.points); limit != c.limit || reason != c.reason {
			t.Errorf("%s: %d (%s), want %d (%s)", c.name, limit, reason, c.limit, c.reason)
		}
	}
	// The throughput limit never goes below desired.
	if limit, _ := growthLimit(spec, 5, false, worse); limit != 5 {
		t.Errorf("desired 5 above the throughput limit 4: limit %d, want 5", limit)
	}
}

func TestThroughputPoints(t *testing.T) {
	changed := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	m := etjobv1.MembershipStatus{ChangeTime: &metav1.Time{Time: changed}, Hosts: []string{"a", "b", "c"}}
	report := func(name string, sps float64, workers int32, at time.Time) *podView {
		return &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}, ready: true, scheduled: true,
			checkpoint: &etjobv1.CheckpointAnnotation{Time: at.Format(time.RFC3339), SamplesPerSecond: sps, Workers: workers}}
	}
	old := []etjobv1.ThroughputPoint{{Workers: 2, SamplesPerSecond: 190}, {Workers: 3, SamplesPerSecond: 1}}
	ws := []*podView{
		report("a", 100, 0, changed.Add(time.Second)),   // the membership's size: 3
		report("b", 100.4, 3, changed.Add(time.Second)), // says 3
		report("c", 999, 3, changed.Add(-time.Second)),  // before the change: not counted
	}
	got := throughputPoints(old, m, ws)
	want := []etjobv1.ThroughputPoint{{Workers: 2, SamplesPerSecond: 190}, {Workers: 3, SamplesPerSecond: 200}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("points %+v, want %+v", got, want)
	}
	if old[1].SamplesPerSecond != 1 {
		t.Error("throughputPoints changed the points it was given")
	}
	if got := throughputPoints(old, etjobv1.MembershipStatus{}, ws); len(got) != 2 || got[1].SamplesPerSecond != 1 {
		t.Errorf("no membership yet: %+v, want the old points", got)
	}
}
