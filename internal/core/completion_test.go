package core_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

// TestDecideCompletion runs the Decide cases of completion, failure by
// deadline, and a finished job's cleanup and TTL (completion.go).
func TestDecideCompletion(t *testing.T) {
	runDecideCases(t, map[string]decideCase{
		"horovod completes when the launcher exits 0": {
			job: base().Framework(etjobv1.FrameworkHorovod).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").Exited(0, t0).Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes:        nodes("od", "n0", "n1"),
			wantDelete:   []string{"j-worker-0", "j-worker-1"},
			wantCondTrue: []string{etjobv1.ConditionComplete},
			wantSummary:  "Succeeded",
			wantEvents:   []wantEvent{normal(etjobv1.EventCompleted, "launcher exited 0")},
		},
		"torchrun waits for the other members after the first exits 0": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Node("n0").Exited(0, t0.Add(-10*time.Second)).Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantHosts:      []string{"j-worker-1:1", "j-worker-2:1"},
			wantGeneration: 2,
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonCompleting},
			wantSummary:    etjobv1.ReasonCompleting,
			wantRequeue:    50 * time.Second,
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 2: 2 members")},
		},
		"torchrun completes when every member exited 0 and cleans running pods": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Node("n0").Exited(0, t0).Obj(),
				MakeWorker(base().Obj(), 1).Node("n1").Exited(0, t0).Obj(),
			},
			nodes:        nodes("od", "n0", "n1"),
			wantDelete:   []string{"j-launcher"},
			wantCondTrue: []string{etjobv1.ConditionComplete},
			wantSummary:  "Succeeded",
			wantEvents:   []wantEvent{normal(etjobv1.EventCompleted, "a worker exited 0 and the other members finished")},
		},
		"a worker failing on the closed rendezvous after completion is not a failure": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Node("n0").Exited(0, t0).Obj(),
				MakeWorker(base().Obj(), 1).Node("n1").Exited(0, t0).Obj(),
				MakeWorker(base().Obj(), 2).Node("n2").Exited(1, t0).Obj(),
			},
			nodes:        nodes("od", "n0", "n1", "n2"),
			wantDelete:   []string{"j-launcher"},
			wantCondTrue: []string{etjobv1.ConditionComplete},
			wantSummary:  "Succeeded",
			wantEvents:   []wantEvent{normal(etjobv1.EventCompleted, "a worker exited 0 and the other members finished")},
		},
		"activeDeadlineSeconds fails the job": {
			job:            base().ActiveDeadline(60).Status(running(etjobv1.ElasticJobStatus{})).Obj(),
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantCondReason: map[string]string{etjobv1.ConditionFailed: etjobv1.ReasonDeadlineExceeded},
			wantSummary:    "Failed",
			wantEvents:     []wantEvent{warning(etjobv1.EventFailed, "job was active longer than spec.activeDeadlineSeconds (60s)")},
		},
		"a finished job is deleted after its TTL": {
			job: base().TTL(10).Status(etjobv1.ElasticJobStatus{CompletionTime: &metav1.Time{Time: t0.Add(-11 * time.Second)},
				Conditions: []metav1.Condition{{Type: etjobv1.ConditionComplete, Status: metav1.ConditionTrue, Reason: "Succeeded"}}}).Obj(),
			wantCondTrue:  []string{etjobv1.ConditionComplete},
			wantSummary:   "Succeeded",
			wantDeleteJob: true,
		},
		"a finished job waits for its TTL": {
			job: base().TTL(10).Status(etjobv1.ElasticJobStatus{CompletionTime: &metav1.Time{Time: t0.Add(-4 * time.Second)},
				Conditions: []metav1.Condition{{Type: etjobv1.ConditionComplete, Status: metav1.ConditionTrue, Reason: "Succeeded"}}}).Obj(),
			wantCondTrue: []string{etjobv1.ConditionComplete},
			wantSummary:  "Succeeded",
			wantRequeue:  6 * time.Second,
		},
		"a finished job a fraction of a millisecond before its TTL looks again at the TTL, not never": {
			// The requeue was rounded to the nearest millisecond: 300 µs
			// became 0, no requeue and no deletion, and with no event left
			// the job was never deleted (TestCompletionCleanupAndTTL's flake).
			job: base().TTL(10).Status(etjobv1.ElasticJobStatus{CompletionTime: &metav1.Time{Time: t0.Add(-10 * time.Second)},
				Conditions: []metav1.Condition{{Type: etjobv1.ConditionComplete, Status: metav1.ConditionTrue, Reason: "Succeeded"}}}).Obj(),
			now:          t0.Add(-300 * time.Microsecond),
			wantCondTrue: []string{etjobv1.ConditionComplete},
			wantSummary:  "Succeeded",
			wantRequeue:  time.Millisecond,
		},
		"cleanPodPolicy All deletes finished pods too": {
			job: base().CleanPodPolicy(etjobv1.CleanPodPolicyAll).Status(etjobv1.ElasticJobStatus{
				Conditions: []metav1.Condition{{Type: etjobv1.ConditionFailed, Status: metav1.ConditionTrue, Reason: "X"}}}).Obj(),
			pods: []*corev1.Pod{
				MakeWorker(base().Obj(), 0).Node("n0").Exited(1, t0).Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes:        nodes("n0", "n1"),
			wantDelete:   []string{"j-worker-0", "j-worker-1"},
			wantCondTrue: []string{etjobv1.ConditionFailed},
			wantSummary:  "Failed",
		},
	})
}

// TestFinishEventReasons checks, as the words `kubectl describe` shows, the
// reason of the Event a job emits when it finishes: a failed job's read
// "Faild" while it was built from its timeline entry's kind (issue #12). The
// timeline keeps its kinds.
func TestFinishEventReasons(t *testing.T) {
	cases := map[string]struct {
		job          *etjobv1.ElasticJob
		pods         []*corev1.Pod
		wantWarning  bool
		wantReason   string
		wantTimeline string
	}{
		"a job past spec.activeDeadlineSeconds fails": {
			job:         base().ActiveDeadline(60).Status(running(etjobv1.ElasticJobStatus{})).Obj(),
			wantWarning: true, wantReason: "Failed", wantTimeline: "Fail",
		},
		"a horovod launcher that does not run horovodrun fails": {
			job:         base().Framework(etjobv1.FrameworkHorovod).LauncherCommand("python", "train.py").Obj(),
			wantWarning: true, wantReason: "Failed", wantTimeline: "Fail",
		},
		"a worker failure under restartPolicy Never fails": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 1})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Node("n0").Exited(1, t0).Obj(),
			},
			wantWarning: true, wantReason: "Failed", wantTimeline: "Fail",
		},
		"a horovod job whose launcher exited 0 completes": {
			job: base().Framework(etjobv1.FrameworkHorovod).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 1})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").Exited(0, t0).Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
			},
			wantReason: "Completed", wantTimeline: "Complete",
		},
		"a torchrun job whose workers exited 0 completes": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 1})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Node("n0").Exited(0, t0).Obj(),
			},
			wantReason: "Completed", wantTimeline: "Complete",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			plan := core.Decide(core.Snapshot{Job: tc.job, Pods: tc.pods, Nodes: nodes("od", "n0")}, t0)
			if len(plan.Events) == 0 {
				t.Fatalf("no Events, want a %s one", tc.wantReason)
			}
			last := plan.Events[len(plan.Events)-1]
			if string(last.Reason) != tc.wantReason || last.Warning != tc.wantWarning {
				t.Errorf("last Event = %+v, want reason %q (warning %v)", last, tc.wantReason, tc.wantWarning)
			}
			tl := plan.Status.Timeline
			if len(tl) == 0 || tl[len(tl)-1].Type != tc.wantTimeline {
				t.Errorf("timeline = %+v, want a %s entry last", tl, tc.wantTimeline)
			}
		})
	}
}
