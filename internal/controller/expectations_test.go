package controller

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestExpectationsJobSynced(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "j"}
	cases := map[string]struct {
		written string // "" : nothing written
		cached  string
		want    bool
	}{
		"nothing written":                              {cached: "5", want: true},
		"the cache shows the write":                    {written: "10", cached: "10", want: true},
		"the cache is newer":                           {written: "10", cached: "11", want: true},
		"the cache lags":                               {written: "10", cached: "9", want: false},
		"longer is newer (not compared as text)":       {written: "99", cached: "100", want: true},
		"shorter is older (not compared as text)":      {written: "100", cached: "99", want: false},
		"a resourceVersion that is not well formed":    {written: "10", cached: "x7", want: true},
		"a written version that is not well formed":    {written: "07", cached: "5", want: true},
		"a version beyond 64 bits is still comparable": {written: "18446744073709551616", cached: "18446744073709551615", want: false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := NewExpectations()
			if tc.written != "" {
				e.StatusWritten(key, tc.written)
			}
			if got := e.JobSynced(key, tc.cached); got != tc.want {
				t.Errorf("JobSynced(%s) after a write at %s = %v, want %v", tc.cached, tc.written, got, tc.want)
			}
		})
	}
	// Once synced, the write is forgotten: an older cache no longer waits.
	e := NewExpectations()
	e.StatusWritten(key, "10")
	if !e.JobSynced(key, "10") || !e.JobSynced(key, "3") {
		t.Error("a synced write must be forgotten")
	}
}

func TestExpectationsSatisfied(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "j"}
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	pod := func(name string, deleting bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if deleting {
			ts := metav1.NewTime(t0)
			p.DeletionTimestamp = &ts
		}
		return p
	}
	e := NewExpectations()
	if !e.Satisfied(key, nil, t0) {
		t.Fatal("nothing expected: satisfied")
	}
	e.ExpectCreate(key, "w-1", t0)
	e.ExpectDelete(key, "w-0", t0)
	if e.Satisfied(key, []*corev1.Pod{pod("w-0", false)}, t0) {
		t.Error("the create is not in the cache yet and the delete not seen: not satisfied")
	}
	if e.Satisfied(key, []*corev1.Pod{pod("w-0", true)}, t0) {
		t.Error("the delete is seen (terminating) but the create is not: not satisfied")
	}
	if !e.Satisfied(key, []*corev1.Pod{pod("w-1", false)}, t0) {
		t.Error("the create shows and the deleted pod is gone: satisfied")
	}

	// A create that failed, or a delete that failed, is not waited for.
	e.ExpectCreate(key, "w-2", t0)
	e.CreateObserved(key, "w-2")
	e.ExpectDelete(key, "w-1", t0)
	e.DeleteObserved(key, "w-1")
	if !e.Satisfied(key, []*corev1.Pod{pod("w-1", false)}, t0) {
		t.Error("failed writes must not be expected")
	}

	// A lost watch event does not stall the job for ever.
	e.ExpectCreate(key, "w-3", t0)
	if e.Satisfied(key, nil, t0.Add(expectationsTimeout)) {
		t.Error("within expectationsTimeout the create is still expected")
	}
	if !e.Satisfied(key, nil, t0.Add(expectationsTimeout+time.Second)) {
		t.Error("past expectationsTimeout the cache is trusted again")
	}

	// Forget drops everything of a deleted job.
	e.ExpectCreate(key, "w-4", t0)
	e.StatusWritten(key, "50")
	e.Forget(key)
	if !e.Satisfied(key, nil, t0) || !e.JobSynced(key, "1") {
		t.Error("Forget must drop the job's expectations")
	}
}
