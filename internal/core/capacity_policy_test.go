package core

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// The capacity policies as functions. Decide's tables (capacity_test.go) keep
// the stories across policies.

func TestBelowMinStops(t *testing.T) {
	w := func(name string, ready bool) *podView {
		return &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}, ready: ready, scheduled: true}
	}
	workers := []*podView{w("a", true), w("b", false), w("c", true), w("d", true)}
	told := func(v *podView) bool { return v.pod.Name == "d" }
	if got := belowMinStops(2, 2, workers, told); got != nil {
		t.Errorf("at min: %s told to stop", names(got))
	}
	if got := names(belowMinStops(1, 2, workers, told)); got != "a, c" {
		t.Errorf("below min: %q told to stop, want the ready workers not already told (a, c)", got)
	}
	if got := belowMinStops(0, 2, nil, told); got == nil || len(got) != 0 {
		t.Errorf("below min with nobody to tell: %v, want an empty list", got)
	}
}

func TestJudgeMaxWait(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	spec := &etjobv1.ElasticJobSpec{MinReplicas: 2, MaxWaitTime: 60}
	since := &metav1.Time{Time: now.Add(-20 * time.Second)}
	long := &metav1.Time{Time: now.Add(-60 * time.Second)}
	for _, c := range []struct {
		name    string
		spec    *etjobv1.ElasticJobSpec
		members int
		since   *metav1.Time
		want    waitVerdict
	}{
		{"enough members: the wait is over", spec, 2, since, waitVerdict{}},
		{"just fell below: the wait starts now", spec, 1, nil, waitVerdict{Since: &metav1.Time{Time: now}, Recheck: now.Add(time.Minute)}},
		{"waiting", spec, 1, since, waitVerdict{Since: since, Recheck: now.Add(40 * time.Second)}},
		{"the wait ran out: release, and wait again", spec, 0, long, waitVerdict{Since: &metav1.Time{Time: now}, Release: true, Recheck: now.Add(time.Minute)}},
		{"no maxWaitTime: wait for ever", &etjobv1.ElasticJobSpec{MinReplicas: 2}, 1, long, waitVerdict{Since: long}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := judgeMaxWait(c.spec, c.members, c.since, now)
			if (got.Since == nil) != (c.want.Since == nil) || (got.Since != nil && !got.Since.Equal(c.want.Since)) ||
				got.Release != c.want.Release || !got.Recheck.Equal(c.want.Recheck) {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}
