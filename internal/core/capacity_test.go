package core_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

// TestDecideCapacity runs the Decide cases of below minReplicas: the stop,
// maxWaitTime, and waiting for capacity (capacity.go).
func TestDecideCapacity(t *testing.T) {
	runDecideCases(t, map[string]decideCase{
		"maxWaitTime releases idle scheduled workers below min": {
			job: base().MaxWaitTime(60).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				BelowMinSince: &metav1.Time{Time: t0.Add(-61 * time.Second)}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Obj(),
				MakeWorker(base().Obj(), 2).Obj(),
			},
			nodes:          nodes("od", "n0"),
			wantDelete:     []string{"j-worker-0"},
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "Pending",
			wantRequeue:    60 * time.Second,
			wantEvents:     []wantEvent{warning(etjobv1.EventMaxWaitTimeExceeded, "released 1 idle workers")},
		},
		"maxWaitTime never applies to pods waiting to be scheduled": {
			job: base().MaxWaitTime(60).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				BelowMinSince: &metav1.Time{Time: t0.Add(-61 * time.Second)}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Unschedulable("0/3 nodes are available").Obj(),
				MakeWorker(base().Obj(), 1).Obj(),
				MakeWorker(base().Obj(), 2).Obj(),
			},
			nodes:          nodes("od"),
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "Pending",
			wantRequeue:    60 * time.Second,
		},
		"a survivor that stopped for capacity is released, not preempted": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 1).Told(t0.Add(-5*time.Second), etjobv1.ReasonWaitingForCapacity).Node("n1").Exited(75, t0).Obj(),
				MakeWorker(base().Obj(), 2).Obj(),
			},
			nodes:          nodes("od", "n1"),
			wantDelete:     []string{"j-worker-1"},
			wantCreate:     []int32{3},
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "Pending",
		},
	})
}

func TestWaitingForCapacityAfterRunning(t *testing.T) {
	job := MakeElasticJob("j", "ns").Replicas(2).Min(2).Max(2).Status(running(etjobv1.ElasticJobStatus{
		NextWorkerIndex: 3,
		Membership:      etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}},
		Conditions:      []metav1.Condition{{Type: etjobv1.ConditionRunning, Status: metav1.ConditionTrue, Reason: etjobv1.ReasonMembersReady}},
	})).Obj()
	pods := []*corev1.Pod{
		MakeLauncher(job).Ready("od").Obj(),
		MakeWorker(job, 0).Ready("n0").Obj(),
		MakeWorker(job, 2).Unschedulable("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.").Obj(),
	}
	plan := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes("od", "n0")}, t0)
	c := cond(plan.Status, etjobv1.ConditionSuspended)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != etjobv1.ReasonWaitingForCapacity {
		t.Fatalf("Suspended = %+v, want True/WaitingForCapacity", c)
	}
	want := "waiting for capacity: 0 of spec.minReplicas (2) workers ready, 1 pending: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
	if c.Message != want {
		t.Errorf("message = %q, want %q", c.Message, want)
	}
	// Below min, the survivor is told to checkpoint at the agreed step and stop.
	if len(plan.Signal) != 1 || plan.Signal[0].Pod != "j-worker-0" || plan.Signal[0].Reason != etjobv1.ReasonWaitingForCapacity {
		t.Errorf("signals = %+v, want j-worker-0 told to stop for WaitingForCapacity", plan.Signal)
	}
	if plan.Status.Summary != etjobv1.ReasonWaitingForCapacity {
		t.Errorf("summary = %q", plan.Status.Summary)
	}
	// The membership change comes first, then the suspension it causes.
	checkEvents(t, []wantEvent{
		normal(etjobv1.EventMembershipChanged, "generation 2: 0 members"),
		warning(etjobv1.EventWaitingForCapacity, "waiting for capacity: 0 of spec.minReplicas (2) workers ready, 1 pending"),
	}, plan.Events)
	// Capacity returns: the job resumes and says so.
	job.Status = plan.Status
	pods[2] = MakeWorker(job, 2).Ready("n2").Obj()
	plan = core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes("od", "n0", "n2")}, t0.Add(time.Minute))
	if !meta.IsStatusConditionTrue(plan.Status.Conditions, etjobv1.ConditionRunning) ||
		meta.IsStatusConditionTrue(plan.Status.Conditions, etjobv1.ConditionSuspended) {
		t.Errorf("after capacity returned: conditions %+v", plan.Status.Conditions)
	}
	if last := plan.Status.Timeline[len(plan.Status.Timeline)-1]; last.Type != "Resume" {
		t.Errorf("last timeline event = %+v, want Resume", last)
	}
	checkEvents(t, []wantEvent{
		normal(etjobv1.EventMembershipChanged, "generation 3: 2 members"),
		normal(etjobv1.EventResumed, "capacity returned: resuming from the last checkpoint"),
	}, plan.Events)
}
