package core

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// TestJudgeHeartbeats calls the heartbeat policy as the function it is: the
// reporting members and the time in, a verdict out. Decide's own table
// (heartbeat_test.go) keeps the stories across policies.
func TestJudgeHeartbeats(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	member := func(name string, step int64, world int32, round int64, since, roundSince time.Duration) *podView {
		return &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}},
			heartbeat: &heartbeat{step: step, world: world, round: round, since: now.Add(-since), roundSince: now.Add(-roundSince)}}
	}
	for _, c := range []struct {
		name    string
		ws      []*podView
		replace string // names, ", "-joined
		reason  string
		recheck time.Duration // from now; 0: none
	}{
		{name: "nobody reports"},
		{name: "all advance in one round: look again when the oldest could turn stale",
			ws:      []*podView{member("w0", 10, 2, 1, 10*time.Second, 5*time.Minute), member("w1", 10, 2, 1, 40*time.Second, 5*time.Minute)},
			recheck: HeartbeatStale - 40*time.Second},
		{name: "one stuck while another advanced",
			ws:      []*podView{member("w0", 90, 2, 1, 5*time.Second, 5*time.Minute), member("w1", 40, 2, 1, HeartbeatStale+time.Second, 5*time.Minute)},
			replace: "w1", reason: etjobv1.ReasonMemberStuck, recheck: HeartbeatStale - 5*time.Second},
		{name: "all stale: the job paused, nobody is stuck",
			ws: []*podView{member("w0", 90, 2, 1, 3*HeartbeatStale, 5*time.Minute), member("w1", 40, 2, 1, 3*HeartbeatStale, 5*time.Minute)}},
		{name: "split for over SplitAfter: those outside the largest world go",
			ws: []*podView{member("w0", 90, 3, 4, time.Second, 2*SplitAfter), member("w1", 91, 3, 4, time.Second, 2*SplitAfter),
				member("w2", 20, 1, 5, time.Second, 2*SplitAfter)},
			replace: "w2", reason: etjobv1.ReasonSplit, recheck: HeartbeatStale - time.Second},
		{name: "one member claims a huge world: it is split off, not the members that outnumber it",
			ws: []*podView{member("w0", 90, 3, 4, time.Second, 2*SplitAfter), member("w1", 91, 3, 4, time.Second, 2*SplitAfter),
				member("w2", 90, 3, 4, time.Second, 2*SplitAfter), member("w3", 20, 1000, 9, time.Second, 2*SplitAfter)},
			replace: "w3", reason: etjobv1.ReasonSplit, recheck: HeartbeatStale - time.Second},
		{name: "one member claims the members' world in a newer round: the round most members report is kept",
			ws: []*podView{member("w0", 90, 3, 4, time.Second, 2*SplitAfter), member("w1", 91, 3, 4, time.Second, 2*SplitAfter),
				member("w3", 20, 3, 99, time.Second, 2*SplitAfter)},
			replace: "w3", reason: etjobv1.ReasonSplit, recheck: HeartbeatStale - time.Second},
		{name: "apart, but a round is younger than SplitAfter: look again when it settles",
			ws:      []*podView{member("w0", 90, 3, 4, time.Second, 2*SplitAfter), member("w1", 20, 1, 5, time.Second, 10*time.Second)},
			recheck: SplitAfter - 10*time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := judgeHeartbeats(c.ws, now)
			if got := names(v.Replace); got != c.replace || v.Reason != c.reason {
				t.Errorf("replace %q (%s), want %q (%s): %s", got, v.Reason, c.replace, c.reason, v.Message)
			}
			if c.reason != "" && !strings.Contains(v.Message, c.replace) {
				t.Errorf("message %q does not name %s", v.Message, c.replace)
			}
			var want time.Time
			if c.recheck != 0 {
				want = now.Add(c.recheck)
			}
			if !v.Recheck.Equal(want) {
				t.Errorf("recheck %v, want %v", v.Recheck, want)
			}
		})
	}
}
