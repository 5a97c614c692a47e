package core

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// TestJudgeHandover: Horovod's rule (a host set change keeps a host that
// carries the state) as a function. Decide's tables (horovod_test.go) keep
// the stories.
func TestJudgeHandover(t *testing.T) {
	w := func(name string, edit func(*podView)) *podView {
		v := &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}, ready: true}
		if edit != nil {
			edit(v)
		}
		return v
	}
	a, b := w("a", nil), w("b", nil)
	leaving := w("c", func(v *podView) { v.leaveAt = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC) })
	lost := w("d", func(v *podView) { v.lost = true })
	joiner := w("e", nil)
	prev := map[string]bool{"a": true, "b": true, "c": true, "d": true}
	none := func(*podView) bool { return false }
	for _, c := range []struct {
		name    string
		prev    map[string]bool
		members []*podView
		stopped bool
		told    func(*podView) bool
		want    handoverVerdict
	}{
		{"a member of the set stays: nothing to do", prev, []*podView{a, joiner}, false, none, handoverVerdict{}},
		{"no set published yet", map[string]bool{}, []*podView{joiner}, false, none, handoverVerdict{}},
		{"already stopped: only the set's members stay", prev, []*podView{a, joiner}, true, none, handoverVerdict{keepPublished: true}},
		{"none of the set stays, joiners ready: a handover stop", prev, []*podView{joiner}, false, none,
			handoverVerdict{keepPublished: true, stop: true, reason: etjobv1.ReasonStateHandover, tell: []*podView{a, b}, joiners: 1}},
		{"none stays, no joiner: a stop below min", prev, nil, false, none,
			handoverVerdict{keepPublished: true, stop: true, reason: etjobv1.ReasonWaitingForCapacity, tell: []*podView{a, b}}},
		{"a worker already told this pass is not told again", prev, nil, false, func(v *podView) bool { return v == b },
			handoverVerdict{keepPublished: true, stop: true, reason: etjobv1.ReasonWaitingForCapacity, tell: []*podView{a}}},
	} {
		got := judgeHandover(c.prev, c.members, []*podView{a, b, leaving, lost, joiner}, c.stopped, c.told)
		if got.keepPublished != c.want.keepPublished || got.stop != c.want.stop || got.reason != c.want.reason ||
			names(got.tell) != names(c.want.tell) || got.joiners != c.want.joiners {
			t.Errorf("%s: %+v (told %q), want %+v (told %q)", c.name, got, names(got.tell), c.want, names(c.want.tell))
		}
	}
}
