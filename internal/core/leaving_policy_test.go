package core

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// The leave rule as functions. Decide's tables (leaving_test.go) keep the
// stories across policies.

func TestLeaveAction(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	grace := 30 * time.Second
	worker := func(scheduled, ready bool, phase corev1.PodPhase, reason string, toldAgo time.Duration) *podView {
		return &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w"}, Status: corev1.PodStatus{Phase: phase}},
			scheduled: scheduled, ready: ready, leaveReason: reason, leaveAt: now.Add(-toldAgo)}
	}
	noticed := func(w *podView, deadlineIn time.Duration) *podView {
		w.noticed, w.noticeDeadline, w.noticeReason = true, now.Add(deadlineIn), "PodNotice(aws)"
		return w
	}
	for _, c := range []struct {
		name   string
		w      *podView
		want   leaveOutcome
		at     time.Time
		reason string
	}{
		{"never scheduled: a release at once", worker(false, false, corev1.PodPending, etjobv1.ReasonScaleIn, 0), leaveDeleted, time.Time{}, etjobv1.ReasonScaleIn},
		{"pending on a noticed node: preempted at once", noticed(worker(true, false, corev1.PodPending, "", 0), time.Minute), leavePreempted, time.Time{}, "PodNotice(aws)"},
		{"in its grace period", worker(true, true, corev1.PodRunning, etjobv1.ReasonScaleIn, 10*time.Second), leaveWait, now.Add(20 * time.Second), ""},
		{"grace over, a release", worker(true, true, corev1.PodRunning, etjobv1.ReasonScaleIn, grace), leaveDeleted, time.Time{}, "LeaveGracePeriodExpired"},
		{"grace over, not a release", worker(true, true, corev1.PodRunning, etjobv1.ReasonRestarting, grace), leavePreempted, time.Time{}, "LeaveGracePeriodExpired"},
		{"grace over but its node lives on: wait for the notice's deadline", noticed(worker(true, true, corev1.PodRunning, "", grace), time.Minute),
			leaveWait, now.Add(time.Minute), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, at := leaveAction(c.w, grace, now)
			if got != c.want || !at.Equal(c.at) {
				t.Errorf("got %v at %v, want %v at %v", got, at, c.want, c.at)
			}
			if c.reason != "" && c.w.giveUpReason() != c.reason {
				t.Errorf("reason %q, want %q", c.w.giveUpReason(), c.reason)
			}
		})
	}
}

func TestNoticeStopLead(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	w := &podView{pod: &corev1.Pod{}, ready: true, noticed: true, provider: "aws", noticeDeadline: now.Add(2 * time.Minute)}
	spec := &etjobv1.ElasticJobSpec{}
	lead := noticeStopLead(spec, w, 10*time.Second, now)
	want := (NoticeWindows["aws"].Reserve() + 10*time.Second + StopMargin(spec) + time.Second - 1).Truncate(time.Second)
	if lead != want || lead <= 0 {
		t.Errorf("lead %v, want %v", lead, want)
	}
	if got := noticeStopLead(spec, w, 0, now); got != 0 {
		t.Errorf("no checkpoint reported: lead %v, want 0 (stop at once)", got)
	}
	stop := &etjobv1.ElasticJobSpec{Spot: &etjobv1.SpotSpec{NoticeLeadTime: etjobv1.NoticeLeadTimeStop}}
	if got := noticeStopLead(stop, w, 10*time.Second, now); got != 0 {
		t.Errorf("noticeLeadTime Stop: lead %v, want 0", got)
	}
	late := *w
	late.noticeDeadline = now.Add(time.Second)
	if got := noticeStopLead(spec, &late, 10*time.Second, now); got != 0 {
		t.Errorf("the stop time has passed: lead %v, want 0", got)
	}
}
