package core

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// The completion policies as functions: small inputs, typed outcomes.
// Decide's tables (completion_test.go) keep the stories across policies.

func TestActiveDeadline(t *testing.T) {
	start := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	secs := int64(60)
	spec := &etjobv1.ElasticJobSpec{ActiveDeadlineSeconds: &secs}
	if ex, _, at := activeDeadline(&etjobv1.ElasticJobSpec{}, start, start.Add(time.Hour)); ex || !at.IsZero() {
		t.Errorf("no deadline: exceeded %v, at %v", ex, at)
	}
	if ex, _, at := activeDeadline(spec, start, start.Add(59*time.Second)); ex || !at.Equal(start.Add(time.Minute)) {
		t.Errorf("before: exceeded %v, at %v", ex, at)
	}
	if ex, msg, at := activeDeadline(spec, start, start.Add(time.Minute)); !ex || msg == "" || !at.IsZero() {
		t.Errorf("at the deadline: exceeded %v (%q), at %v", ex, msg, at)
	}
}

func TestJudgeCompletion(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	w := func(name string, succeeded, terminal bool, finishedAgo time.Duration) *podView {
		v := &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}, succeeded: succeeded, terminal: terminal || succeeded, scheduled: true}
		if succeeded && finishedAgo >= 0 {
			v.finishedAt = now.Add(-finishedAgo)
		}
		return v
	}
	for _, c := range []struct {
		name    string
		workers []*podView
		gone    map[string]bool
		want    completionVerdict
	}{
		{name: "nobody exited 0", workers: []*podView{w("a", false, false, 0), w("b", false, true, 0)}},
		{name: "one exited 0, one runs: wait out the grace", workers: []*podView{w("a", true, true, 10*time.Second), w("b", false, false, 0)},
			want: completionVerdict{Started: true, Running: 1, Until: now.Add(CompletionGracePeriod - 10*time.Second)}},
		{name: "the grace is over", workers: []*podView{w("a", true, true, CompletionGracePeriod), w("b", false, false, 0)},
			want: completionVerdict{Started: true, Done: true, Running: 1, Until: now}},
		{name: "the others finished", workers: []*podView{w("a", true, true, time.Second), w("b", false, true, 0)},
			want: completionVerdict{Started: true, Done: true, Until: now.Add(CompletionGracePeriod - time.Second)}},
		{name: "a runner deleted this pass does not count", workers: []*podView{w("a", true, true, time.Second), w("b", false, false, 0)},
			gone: map[string]bool{"b": true}, want: completionVerdict{Started: true, Done: true, Until: now.Add(CompletionGracePeriod - time.Second)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := judgeCompletion(c.workers, c.gone, now); got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestCleanupAndTTL(t *testing.T) {
	running := &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "r"}}}
	done := &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "d"}}, terminal: true}
	pods := []*podView{running, done}
	for policy, want := range map[etjobv1.CleanPodPolicy]string{
		etjobv1.CleanPodPolicyAll: "r, d", etjobv1.CleanPodPolicyNone: "", etjobv1.CleanPodPolicyRunning: "r", "": "r",
	} {
		if got := names(cleanup(policy, pods)); got != want {
			t.Errorf("cleanPodPolicy %q deletes %q, want %q", policy, got, want)
		}
	}
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	ttl := int32(30)
	spec := &etjobv1.ElasticJobSpec{TTLSecondsAfterFinished: &ttl}
	done30 := &metav1.Time{Time: now.Add(-30 * time.Second)}
	done10 := &metav1.Time{Time: now.Add(-10 * time.Second)}
	if del, at := ttlAfterFinished(spec, done30, now); !del || !at.IsZero() {
		t.Errorf("TTL over: delete %v, at %v", del, at)
	}
	if del, at := ttlAfterFinished(spec, done10, now); del || !at.Equal(now.Add(20*time.Second)) {
		t.Errorf("TTL running: delete %v, at %v", del, at)
	}
	if del, at := ttlAfterFinished(&etjobv1.ElasticJobSpec{}, done30, now); del || !at.IsZero() {
		t.Errorf("no TTL: delete %v, at %v", del, at)
	}
}
