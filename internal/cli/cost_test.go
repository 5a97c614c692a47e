package cli

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// TestStatusCost: `etjob cost` prints the controller's bill, with the
// on-demand price given where the bill knows none.
func TestStatusCost(t *testing.T) {
	at := metav1.NewMicroTime(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	job := &etjobv1.ElasticJob{ObjectMeta: metav1.ObjectMeta{Name: "digits", Namespace: "ml"}}
	if _, ok := StatusCost(job, 0); ok {
		t.Fatal("a job without status.cost has a bill")
	}
	job.Status.Cost = &etjobv1.CostStatus{Time: &at, Rows: []etjobv1.CostRow{
		{CapacityType: "spot", PricePerHour: "0.9", OnDemandPricePerHour: "3", Milliseconds: 2 * 3600 * 1000},
		{CapacityType: "spot", PricePerHour: "1.2", Milliseconds: 1800 * 1000},
	}}
	c, ok := StatusCost(job, 3)
	if !ok || len(c.Rows) != 2 || c.Rows[1].OnDemandPrice != 3 || c.Rows[0].Hours != 2 {
		t.Fatalf("StatusCost = %+v, %v", c, ok)
	}
	var b strings.Builder
	printCost(&b, c)
	for _, want := range []string{"the controller's bill, every worker pod the job ran, up to 2026-12-01T12:00:00Z", "2.500", "2.4000", "On-demand equivalent: 7.5000", "Saved:                68.0%"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("etjob cost printed\n%s\nwithout %q", b.String(), want)
		}
	}
}

// TestJobStatus: Arena's STATUS column comes from the job's conditions, never
// from status.summary's words (the summary is set to a word the rule would
// misread in every case).
func TestJobStatus(t *testing.T) {
	cond := func(typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason}
	}
	for _, c := range []struct {
		want  string
		conds []metav1.Condition
	}{
		{"PENDING", nil},
		{"RUNNING", []metav1.Condition{cond(etjobv1.ConditionRunning, metav1.ConditionTrue, etjobv1.ReasonMembersReady)}},
		{"RESTARTING", []metav1.Condition{cond(etjobv1.ConditionRunning, metav1.ConditionFalse, etjobv1.ReasonRestarting)}},
		{"PENDING", []metav1.Condition{cond(etjobv1.ConditionRunning, metav1.ConditionFalse, "Waiting")}},
		{"SUSPENDED", []metav1.Condition{cond(etjobv1.ConditionSuspended, metav1.ConditionTrue, etjobv1.ReasonUserSuspended)}},
		{"PENDING", []metav1.Condition{cond(etjobv1.ConditionSuspended, metav1.ConditionTrue, etjobv1.ReasonWaitingForCapacity),
			cond(etjobv1.ConditionRunning, metav1.ConditionFalse, etjobv1.ReasonWaitingForCapacity)}},
		{"PENDING", []metav1.Condition{cond(etjobv1.ConditionSuspended, metav1.ConditionTrue, etjobv1.ReasonWaitingForCapacity),
			cond(etjobv1.ConditionRunning, metav1.ConditionFalse, etjobv1.ReasonRestarting)}}, // its horovodrun released
		{"SUCCEEDED", []metav1.Condition{cond(etjobv1.ConditionComplete, metav1.ConditionTrue, "Done"),
			cond(etjobv1.ConditionRunning, metav1.ConditionTrue, etjobv1.ReasonMembersReady)}},
		{"FAILED", []metav1.Condition{cond(etjobv1.ConditionFailed, metav1.ConditionTrue, "BackoffLimitExceeded")}},
	} {
		job := &etjobv1.ElasticJob{Status: etjobv1.ElasticJobStatus{Summary: "Running", Conditions: c.conds}}
		if c.want == "RUNNING" {
			job.Status.Summary = "Pending"
		}
		if got := jobStatus(job); got != c.want {
			t.Errorf("conditions %+v: %s, want %s", c.conds, got, c.want)
		}
	}
}
