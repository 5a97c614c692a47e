package core_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

// TestDecideFailures runs the Decide cases of worker failures, preemptions,
// backoffLimit and restarts (failures.go).
func TestDecideFailures(t *testing.T) {
	runDecideCases(t, map[string]decideCase{
		"a worker exiting with the reserved code is a preemption, replaced under a new name": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Node("n2").Exited(etjobv1.ExitCodePreempted, t0).Obj(),
			},
			nodes:           nodes("od", "n0", "n1", "n2"),
			wantDelete:      []string{"j-worker-2"},
			wantCreate:      []int32{3},
			wantHosts:       []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration:  1,
			wantPreemptions: 1,
			wantCondTrue:    []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:     "Resizing",
			wantEvents: []wantEvent{
				normal(etjobv1.EventPreempted, "worker j-worker-2 preempted (GracefulExit); not counted as a failure"),
				normal(etjobv1.EventMembershipChanged, "generation 1: 2 members"),
			},
		},
		"DisruptionTarget, eviction and node loss are preemptions": {
			job: base().Replicas(4).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 4})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Node("n0").Exited(137, t0).Condition(corev1.DisruptionTarget).Obj(),
				MakeWorker(base().Obj(), 1).Node("n1").Exited(1, t0).Reason("Evicted").Obj(),
				MakeWorker(base().Obj(), 2).Ready("gone").Obj(),
				MakeWorker(base().Obj(), 3).Ready("n3").Obj(),
			},
			nodes:           nodes("od", "n0", "n1", "n3"),
			wantDelete:      []string{"j-worker-0", "j-worker-1", "j-worker-2"},
			wantCreate:      []int32{4, 5, 6},
			wantHosts:       []string{"j-worker-3:1"},
			wantGeneration:  1,
			wantPreemptions: 3,
			wantCondReason:  map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonWaitingForCapacity},
			wantSummary:     "Pending",
			wantEvents: []wantEvent{
				normal(etjobv1.EventPreempted, "worker j-worker-0 preempted (DisruptionTarget); not counted as a failure"),
				normal(etjobv1.EventPreempted, "worker j-worker-1 preempted (Evicted); not counted as a failure"),
				normal(etjobv1.EventPreempted, "worker j-worker-2 preempted (NodeLost); not counted as a failure"),
				normal(etjobv1.EventMembershipChanged, "generation 1: 1 members"),
			},
		},
		"a worker released after a pod notice is a preemption, whatever its exit code": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("eci-0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("eci-1").Obj(),
				MakeWorker(base().Obj(), 2).Node("eci-2").Exited(137, t0).Obj(),
			},
			nodes:           nodes("od", "eci-0", "eci-1", "eci-2"),
			podNotices:      map[string]string{"j-worker-2": "SpotToBeReleased"},
			wantCreate:      []int32{3},
			wantDelete:      []string{"j-worker-2"},
			wantHosts:       []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration:  1,
			wantPreemptions: 1,
			wantCondTrue:    []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:     "Resizing",
			wantEvents: []wantEvent{
				normal(etjobv1.EventPreempted, "worker j-worker-2 preempted (PodNotice(SpotToBeReleased)); not counted as a failure"),
				normal(etjobv1.EventMembershipChanged, "generation 1: 2 members"),
			},
		},
		"ExitCode policy replaces a worker killed by a signal": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Node("n2").Exited(137, t0).Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantDelete:     []string{"j-worker-2"},
			wantCreate:     []int32{3},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 1,
			wantFailures:   1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantEvents: []wantEvent{
				warning(etjobv1.EventWorkerFailed, "worker j-worker-2 failed with exit code 137; replacing it under a new name"),
				normal(etjobv1.EventMembershipChanged, "generation 1: 2 members"),
			},
		},
		"ExitCode policy with restartPolicy Never fails the job on a permanent code": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Node("n2").Exited(1, t0).Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantDelete:     []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantFailures:   1,
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantCondReason: map[string]string{etjobv1.ConditionFailed: etjobv1.ReasonWorkerFailed},
			wantSummary:    "Failed",
			wantEvents:     []wantEvent{warning(etjobv1.EventFailed, "worker j-worker-2 failed with exit code 1; spec.workerRestartPolicy is ExitCode and spec.restartPolicy is Never")},
		},
		"Always policy replaces a worker with a permanent code": {
			job: base().WorkerRestartPolicy(etjobv1.WorkerRestartAlways).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Node("n2").Exited(1, t0).Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantDelete:     []string{"j-worker-2"},
			wantCreate:     []int32{3},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 1,
			wantFailures:   1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantEvents: []wantEvent{
				warning(etjobv1.EventWorkerFailed, "worker j-worker-2 failed with exit code 1; replacing it under a new name"),
				normal(etjobv1.EventMembershipChanged, "generation 1: 2 members"),
			},
		},
		"failures beyond backoffLimit fail the job": {
			job: base().BackoffLimit(2).WorkerRestartPolicy(etjobv1.WorkerRestartAlways).
				Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3, Failures: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Node("n2").Exited(1, t0).Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantDelete:     []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantFailures:   3,
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantCondReason: map[string]string{etjobv1.ConditionFailed: etjobv1.ReasonBackoffLimit},
			wantSummary:    "Failed",
			wantEvents:     []wantEvent{warning(etjobv1.EventFailed, "3 failures exceed spec.backoffLimit (2)")},
		},
		"a restart waits until the old attempt's pods are gone": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3, Restarts: 1})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").Deleting(t0).Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes:          nodes("od", "n2"),
			wantDelete:     []string{"j-worker-2"},
			wantRestarts:   1,
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonRestarting},
			wantSummary:    "Restarting",
		},
		"the next attempt starts with fresh names": {
			job:          base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3, Restarts: 1})).Obj(),
			wantLauncher: true,
			wantCreate:   []int32{3, 4, 5},
			wantRestarts: 1,
			wantSummary:  "Pending",
		},
	})
}

// TestDeletionCounts: every count a plan makes is attributed to the deletion
// of its pod, so that the controller can take it back when that deletion
// fails (the next pass sees the pod, and counts it, again).
func TestDeletionCounts(t *testing.T) {
	job := base().WorkerRestartPolicy(etjobv1.WorkerRestartAlways).BackoffLimit(5).
		Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3, Failures: 1, Preemptions: 2})).Obj()
	pods := []*corev1.Pod{
		MakeWorker(base().Obj(), 0).Ready("gone").Obj(),
		MakeWorker(base().Obj(), 1).Node("n1").Exited(1, t0).Obj(),
		MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
	}
	plan := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes("n1", "n2")}, t0)
	got := map[string][2]int32{}
	var failures, preemptions int32
	for _, d := range plan.Delete {
		got[d.Name] = [2]int32{d.Failures, d.Preemptions}
		failures += d.Failures
		preemptions += d.Preemptions
	}
	want := map[string][2]int32{"j-worker-0": {0, 1}, "j-worker-1": {1, 0}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("deletions' counts (-want +got):\n%s", diff)
	}
	if plan.Status.Failures != 1+failures || plan.Status.Preemptions != 2+preemptions {
		t.Errorf("status counts %d/%d are not the old ones plus the deletions' %d/%d",
			plan.Status.Failures, plan.Status.Preemptions, failures, preemptions)
	}
}
