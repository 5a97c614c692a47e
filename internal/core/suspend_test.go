package core_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

// TestDecideSuspend runs the Decide cases of spec.suspend (suspend.go).
func TestDecideSuspend(t *testing.T) {
	runDecideCases(t, map[string]decideCase{
		"suspend releases every pod": {
			job: base().Suspend(true).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Obj(),
			},
			nodes:          nodes("od", "n0"),
			wantDelete:     []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantCondTrue:   []string{etjobv1.ConditionSuspended},
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonUserSuspended},
			wantSummary:    etjobv1.ReasonUserSuspended,
			wantEvents:     []wantEvent{normal(etjobv1.EventSuspended, "job suspended: all pods released")},
		},
		"suspend sets launcherReplacements back to 0: a resumed job's first launcher replaces none": {
			job: base().Recovery(etjobv1.RecoveryInProcess).Suspend(true).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 1, LauncherReplacements: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
			},
			nodes:          nodes("od", "n0"),
			wantDelete:     []string{"j-launcher", "j-worker-0"},
			wantCondTrue:   []string{etjobv1.ConditionSuspended},
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonUserSuspended},
			wantSummary:    etjobv1.ReasonUserSuspended,
			wantEvents:     []wantEvent{normal(etjobv1.EventSuspended, "job suspended: all pods released")},
		},
	})
}

func TestResumeAfterUserSuspend(t *testing.T) {
	job := MakeElasticJob("j", "ns").Replicas(2).Suspend(false).Status(etjobv1.ElasticJobStatus{
		Conditions: []metav1.Condition{{Type: etjobv1.ConditionSuspended, Status: metav1.ConditionTrue, Reason: etjobv1.ReasonUserSuspended}},
	}).Obj()
	plan := core.Decide(core.Snapshot{Job: job}, t0)
	if !plan.CreateLauncher || len(plan.CreateWorkers) != 2 {
		t.Errorf("resume created launcher=%v workers=%v", plan.CreateLauncher, plan.CreateWorkers)
	}
	if plan.Status.StartTime == nil || !plan.Status.StartTime.Time.Equal(t0) {
		t.Errorf("startTime = %v, want reset to now", plan.Status.StartTime)
	}
	if meta.IsStatusConditionTrue(plan.Status.Conditions, etjobv1.ConditionSuspended) {
		t.Errorf("still suspended")
	}
	checkEvents(t, []wantEvent{normal(etjobv1.EventResumed, "job resumed")}, plan.Events)
}
