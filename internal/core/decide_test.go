package core_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	. "github.com/etjob/etjob/internal/testutil"
)

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

func nodes(names ...string) map[string]*corev1.Node {
	m := map[string]*corev1.Node{}
	for _, n := range names {
		m[n] = MakeNode(n).Obj()
	}
	return m
}

func running(st etjobv1.ElasticJobStatus) etjobv1.ElasticJobStatus {
	st.StartTime = &metav1.Time{Time: t0.Add(-time.Hour)}
	return st
}

func deletedNames(p core.Plan) []string {
	var out []string
	for _, d := range p.Delete {
		out = append(out, d.Name)
	}
	return out
}

func signaled(p core.Plan) []string {
	var out []string
	for _, s := range p.Signal {
		out = append(out, s.Pod)
	}
	return out
}

func cond(st etjobv1.ElasticJobStatus, t string) *metav1.Condition {
	return meta.FindStatusCondition(st.Conditions, t)
}

func TestDecide(t *testing.T) {
	base := func() *JobWrapper { return MakeElasticJob("j", "ns").Replicas(3).Min(2).Max(4) }
	cases := map[string]struct {
		job   *etjobv1.ElasticJob
		pods  []*corev1.Pod
		nodes map[string]*corev1.Node
		// podNotices are pod-level notices (Events), by pod name.
		podNotices map[string]string
		now        time.Time

		wantLauncher    bool
		wantCreate      []int32
		wantDelete      []string
		wantSignal      []string
		wantHosts       []string
		wantGeneration  int64
		wantCondTrue    []string
		wantCondReason  map[string]string
		wantSummary     string
		wantRestarts    int32
		wantFailures    int32
		wantPreemptions int32
		wantRequeue     time.Duration
		wantDeleteJob   bool
	}{
		"new job creates the launcher and desired workers": {
			job:          base().Obj(),
			wantLauncher: true,
			wantCreate:   []int32{0, 1, 2},
			wantSummary:  "Pending",
		},
		"replicas above max are clamped to max": {
			job:          base().Replicas(3).Max(3).Obj(),
			wantLauncher: true,
			wantCreate:   []int32{0, 1, 2},
			wantSummary:  "Pending",
		},
		"creates are bounded per pass": {
			job:          base().Replicas(100).Max(100).Obj(),
			wantLauncher: true,
			wantCreate:   seq(0, core.MaxCreatesPerPass),
			wantSummary:  "Pending",
		},
		"ready workers are published with slots from the GPU limit": {
			job: base().GPUs(2).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantHosts:      []string{"j-worker-0:2", "j-worker-1:2", "j-worker-2:2"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning},
			wantSummary:    "Running",
		},
		"scale in tells the highest ready index to leave and drops it from membership": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 4, Hosts: []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantSignal:     []string{"j-worker-2"},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 5,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    30 * time.Second,
		},
		"scale in takes named workers first and deletes unready victims at once": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 4})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Annotation(etjobv1.AnnotationScaleIn, "").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
				MakeWorker(base().Obj(), 3).Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantSignal:     []string{"j-worker-0"},
			wantDelete:     []string{"j-worker-3"},
			wantHosts:      []string{"j-worker-1:1", "j-worker-2:1"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    30 * time.Second,
		},
		"a scale-in leaver that exited is removed without counting anything": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Told(t0.Add(-time.Second), etjobv1.ReasonScaleIn).Node("n2").Exited(75, t0).Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2"),
			wantDelete:     []string{"j-worker-2"},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning},
			wantSummary:    "Running",
		},
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
		},
		"a failed launcher restarts the whole job under OnFailure": {
			job: base().RestartPolicy(etjobv1.RestartPolicyOnFailure).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").Exited(1, t0).Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes:          nodes("od", "n0", "n1"),
			wantDelete:     []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantGeneration: 3,
			wantRestarts:   1,
			wantFailures:   1,
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonRestarting},
			wantSummary:    "Restarting",
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
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "Restarting",
		},
		"the next attempt starts with fresh names": {
			job:          base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3, Restarts: 1})).Obj(),
			wantLauncher: true,
			wantCreate:   []int32{3, 4, 5},
			wantRestarts: 1,
			wantSummary:  "Pending",
		},
		"a preempted launcher restarts the job even under restartPolicy Never": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("gone").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes:           nodes("n0", "n1"),
			wantDelete:      []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantRestarts:    1,
			wantFailures:    1,
			wantPreemptions: 1,
			wantCondReason:  map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonRestarting},
			wantSummary:     "Restarting",
		},
		"a notice on the launcher's node tells every ready worker to checkpoint and stop": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Node("n2").Obj(),
			},
			nodes: map[string]*corev1.Node{"od": MakeNode("od").Notice(t0.Add(2*time.Minute), "aws").Obj(),
				"n0": MakeNode("n0").Obj(), "n1": MakeNode("n1").Obj(), "n2": MakeNode("n2").Obj()},
			wantSignal:     []string{"j-worker-0", "j-worker-1"},
			wantGeneration: 3,
			wantCondTrue:   []string{etjobv1.ConditionResizing},
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonLauncherMoving},
			wantRequeue:    30 * time.Second,
			wantSummary:    "LauncherMoving",
		},
		"the launcher moves once its workers stopped: a restart, not a failure": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Told(t0.Add(-5*time.Second), etjobv1.ReasonLauncherMoving).Exited(etjobv1.ExitCodePreempted, t0).Obj(),
				MakeWorker(base().Obj(), 1).Told(t0.Add(-5*time.Second), etjobv1.ReasonLauncherMoving).Exited(etjobv1.ExitCodePreempted, t0).Obj(),
			},
			nodes:           map[string]*corev1.Node{"od": MakeNode("od").Notice(t0.Add(2*time.Minute), "aws").Obj()},
			wantDelete:      []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantRestarts:    1,
			wantPreemptions: 1,
			wantCondReason:  map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonRestarting},
			wantSummary:     "Restarting",
		},
		"the launcher waits for a worker still within its grace period": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Told(t0.Add(-5*time.Second), etjobv1.ReasonLauncherMoving).Exited(etjobv1.ExitCodePreempted, t0).Obj(),
				MakeWorker(base().Obj(), 1).Told(t0.Add(-5*time.Second), etjobv1.ReasonLauncherMoving).Ready("n1").Obj(),
			},
			nodes:          map[string]*corev1.Node{"od": MakeNode("od").Notice(t0.Add(10*time.Second), "aws").Obj(), "n1": MakeNode("n1").Obj()},
			wantCondTrue:   []string{etjobv1.ConditionResizing},
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonLauncherMoving},
			wantRequeue:    25 * time.Second,
			wantSummary:    "LauncherMoving",
		},
		"the launcher waits for a worker until its node's deadline when that is later than the grace period": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Told(t0.Add(-5*time.Second), etjobv1.ReasonLauncherMoving).Exited(etjobv1.ExitCodePreempted, t0).Obj(),
				MakeWorker(base().Obj(), 1).Told(t0.Add(-5*time.Second), etjobv1.ReasonLauncherMoving).Ready("n1").Obj(),
			},
			nodes:          map[string]*corev1.Node{"od": MakeNode("od").Notice(t0.Add(2*time.Minute), "aws").Obj(), "n1": MakeNode("n1").Obj()},
			wantCondTrue:   []string{etjobv1.ConditionResizing},
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonLauncherMoving},
			wantRequeue:    2 * time.Minute,
			wantSummary:    "LauncherMoving",
		},
		"a noticed launcher lost before the move finished is a preemption, not a failure": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 1})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Exited(137, t0).Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
			},
			nodes:           map[string]*corev1.Node{"od": MakeNode("od").Notice(t0, "gcp").Obj(), "n0": MakeNode("n0").Obj()},
			wantDelete:      []string{"j-launcher", "j-worker-0"},
			wantRestarts:    1,
			wantPreemptions: 1,
			wantCondReason:  map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonRestarting},
			wantSummary:     "Restarting",
		},
		"an ECI SpotToBeReleased Event is a notice: the worker leaves the membership and is told to go": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("eci-0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("eci-1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("eci-2").Obj(),
			},
			nodes:          nodes("od", "eci-0", "eci-1", "eci-2"),
			podNotices:     map[string]string{"j-worker-1": "SpotToBeReleased"},
			wantCreate:     []int32{3},
			wantSignal:     []string{"j-worker-1"},
			wantHosts:      []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration: 3,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantRequeue:    30 * time.Second,
			wantSummary:    "Resizing",
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
		},
		"a launcher whose node went during the move is not a failure either": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 1, Conditions: []metav1.Condition{
				{Type: etjobv1.ConditionRunning, Status: metav1.ConditionFalse, Reason: etjobv1.ReasonLauncherMoving}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("gone").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
			},
			nodes:           nodes("n0"),
			wantDelete:      []string{"j-launcher", "j-worker-0"},
			wantRestarts:    1,
			wantPreemptions: 1,
			wantCondReason:  map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonRestarting},
			wantSummary:     "Restarting",
		},
		"a new worker waits briefly for the others of its scale-out to join with them": {
			job: base().Replicas(4).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 4,
				Membership: etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).ReadySince("n2", t0.Add(-time.Second)).Obj(),
				MakeWorker(base().Obj(), 3).Node("n3").Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2", "n3"),
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 2,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantRequeue:    4 * time.Second,
			wantSummary:    "Resizing",
		},
		"the batch window over, the ready worker joins alone": {
			job: base().Replicas(4).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 4,
				Membership: etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).ReadySince("n2", t0.Add(-core.JoinBatchWindow)).Obj(),
				MakeWorker(base().Obj(), 3).Node("n3").Obj(),
			},
			nodes:          nodes("od", "n0", "n1", "n2", "n3"),
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"},
			wantGeneration: 3,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
		},
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
		},
		"a new horovod job waits for its workers before starting horovodrun": {
			job:         base().Framework(etjobv1.FrameworkHorovod).Obj(),
			wantCreate:  []int32{0, 1, 2},
			wantSummary: "Pending",
		},
		"horovodrun starts once min workers are members": {
			job: base().Framework(etjobv1.FrameworkHorovod).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes:          nodes("n0", "n1"),
			wantLauncher:   true,
			wantCreate:     []int32{2},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
		},
		"horovodrun waits JoinBatchWindow for workers that are still starting": {
			job: base().Framework(etjobv1.FrameworkHorovod).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3})).Obj(),
			pods: []*corev1.Pod{
				MakeWorker(base().Obj(), 0).ReadySince("n0", t0.Add(-time.Second)).Obj(),
				MakeWorker(base().Obj(), 1).ReadySince("n1", t0.Add(-time.Second)).Obj(),
				MakeWorker(base().Obj(), 2).Node("n2").Obj(),
			},
			nodes:          nodes("n0", "n1", "n2"),
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    core.JoinBatchWindow - time.Second,
		},
		"a launcher that cannot run its command fails the job at once, quoting its log": {
			job: base().Framework(etjobv1.FrameworkHorovod).RestartPolicy(etjobv1.RestartPolicyOnFailure).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").ExitedWith(127, t0, "sh: 1: horovodrun: not found").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes:          nodes("od", "n0", "n1"),
			wantDelete:     []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantFailures:   1,
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantCondReason: map[string]string{etjobv1.ConditionFailed: etjobv1.ReasonLauncherFailed},
			wantSummary:    "Failed",
		},
		"a horovod launcher that does not run horovodrun fails the job": {
			job:            base().Framework(etjobv1.FrameworkHorovod).LauncherCommand("python", "train.py").Obj(),
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantCondReason: map[string]string{etjobv1.ConditionFailed: etjobv1.ReasonInvalidLauncher},
			wantSummary:    "Failed",
		},
		"a discovery script etjob does not provide fails the job at once": {
			job:            base().Framework(etjobv1.FrameworkHorovod).LauncherCommand("sh", "-c", "horovodrun -np 2 --host-discovery-script /etc/edl/discover.sh python t.py").Obj(),
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantCondReason: map[string]string{etjobv1.ConditionFailed: etjobv1.ReasonInvalidLauncher},
			wantSummary:    "Failed",
		},
		"horovodrun told to stop below min: its exit is a release even after capacity returned": {
			job: base().Framework(etjobv1.FrameworkHorovod).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 5})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").Told(t0.Add(-5*time.Second), etjobv1.ReasonWaitingForCapacity).Exited(1, t0).Obj(),
				MakeWorker(base().Obj(), 3).Ready("n3").Obj(),
				MakeWorker(base().Obj(), 4).Ready("n4").Obj(),
			},
			nodes:          nodes("od", "n3", "n4"),
			wantDelete:     []string{"j-launcher", "j-worker-3", "j-worker-4"},
			wantRestarts:   1,
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "WaitingForCapacity",
		},
		"horovodrun's exit after the stop below min is a release, not a failure": {
			job: base().Framework(etjobv1.FrameworkHorovod).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Conditions: []metav1.Condition{{Type: etjobv1.ConditionSuspended, Status: metav1.ConditionTrue, Reason: etjobv1.ReasonWaitingForCapacity}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").Exited(1, t0).Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Told(t0.Add(-2*time.Second), etjobv1.ReasonWaitingForCapacity).Obj(),
			},
			nodes:          nodes("od", "n2"),
			wantDelete:     []string{"j-launcher", "j-worker-2"},
			wantRestarts:   1,
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "WaitingForCapacity",
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
		},
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
		"a node notice tells its worker to leave and starts a replacement": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(),
				"n1": MakeNode("n1").Notice(t0.Add(2*time.Minute), "aws").Obj(),
			},
			wantSignal:     []string{"j-worker-1"},
			wantCreate:     []int32{2},
			wantHosts:      []string{"j-worker-0:1"},
			wantGeneration: 1,
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "Pending",
			wantRequeue:    30 * time.Second,
		},
		"a noticed worker past its grace period keeps its node until the deadline (a long checkpoint)": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Annotation(etjobv1.AnnotationLeave, t0.Add(-31*time.Second).Format(time.RFC3339)).Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(), "n2": MakeNode("n2").Obj(),
				"n1": MakeNode("n1").Notice(t0.Add(2*time.Minute), "aws").Obj(),
			},
			wantHosts:      []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantRequeue:    2 * time.Minute,
			wantSummary:    "Resizing",
		},
		"a leaving worker past its grace period is deleted as a preemption": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Annotation(etjobv1.AnnotationLeave, t0.Add(-31*time.Second).Format(time.RFC3339)).Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(), "n2": MakeNode("n2").Obj(),
				"n1": MakeNode("n1").Notice(t0.Add(-time.Second), "aws").Obj(),
			},
			wantDelete:      []string{"j-worker-1"},
			wantHosts:       []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration:  1,
			wantPreemptions: 1,
			wantCondTrue:    []string{etjobv1.ConditionRunning},
			wantSummary:     "Running",
		},
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
		"a worker on a NotReady node is replaced after maxWaitTime": {
			job: base().Replicas(2).MaxWaitTime(60).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Running("n1").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(),
				"n1": MakeNode("n1").NotReady(t0.Add(-2 * time.Minute)).Obj(),
			},
			wantDelete:      []string{"j-worker-1"},
			wantCreate:      []int32{2},
			wantHosts:       []string{"j-worker-0:1"},
			wantGeneration:  1,
			wantPreemptions: 1,
			wantCondReason:  map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonWaitingForCapacity},
			wantSummary:     "Pending",
			wantRequeue:     60 * time.Second,
		},
		"activeDeadlineSeconds fails the job": {
			job:            base().ActiveDeadline(60).Status(running(etjobv1.ElasticJobStatus{})).Obj(),
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantCondReason: map[string]string{etjobv1.ConditionFailed: etjobv1.ReasonDeadlineExceeded},
			wantSummary:    "Failed",
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
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			now := tc.now
			if now.IsZero() {
				now = t0
			}
			plan := core.Decide(core.Snapshot{Job: tc.job, Pods: tc.pods, Nodes: tc.nodes, PodNotices: tc.podNotices}, now)
			if plan.CreateLauncher != tc.wantLauncher {
				t.Errorf("CreateLauncher = %v, want %v", plan.CreateLauncher, tc.wantLauncher)
			}
			if diff := cmp.Diff(tc.wantCreate, plan.CreateWorkers); diff != "" {
				t.Errorf("CreateWorkers (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantDelete, deletedNames(plan)); diff != "" {
				t.Errorf("Delete (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantSignal, signaled(plan)); diff != "" {
				t.Errorf("Signal (-want +got):\n%s", diff)
			}
			st := plan.Status
			if diff := cmp.Diff(tc.wantHosts, st.Membership.Hosts); diff != "" && !(len(tc.wantHosts) == 0 && len(st.Membership.Hosts) == 0) {
				t.Errorf("hosts (-want +got):\n%s", diff)
			}
			if tc.wantGeneration != 0 && st.Membership.Generation != tc.wantGeneration {
				t.Errorf("generation = %d, want %d", st.Membership.Generation, tc.wantGeneration)
			}
			for _, c := range tc.wantCondTrue {
				if !meta.IsStatusConditionTrue(st.Conditions, c) {
					t.Errorf("condition %s not true: %+v", c, st.Conditions)
				}
			}
			for c, r := range tc.wantCondReason {
				if got := cond(st, c); got == nil || got.Reason != r {
					t.Errorf("condition %s reason = %+v, want %s", c, got, r)
				}
			}
			if st.Summary != tc.wantSummary {
				t.Errorf("summary = %q, want %q", st.Summary, tc.wantSummary)
			}
			if st.Restarts != tc.wantRestarts || st.Failures != tc.wantFailures || st.Preemptions != tc.wantPreemptions {
				t.Errorf("restarts/failures/preemptions = %d/%d/%d, want %d/%d/%d", st.Restarts, st.Failures, st.Preemptions,
					tc.wantRestarts, tc.wantFailures, tc.wantPreemptions)
			}
			if plan.RequeueAfter != tc.wantRequeue {
				t.Errorf("RequeueAfter = %v, want %v", plan.RequeueAfter, tc.wantRequeue)
			}
			if plan.DeleteJob != tc.wantDeleteJob {
				t.Errorf("DeleteJob = %v, want %v", plan.DeleteJob, tc.wantDeleteJob)
			}
		})
	}
}

func seq(from, n int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = from + int32(i)
	}
	return out
}

func TestSlotsPerWorker(t *testing.T) {
	three := int32(3)
	cases := map[string]struct {
		job  *etjobv1.ElasticJob
		want int32
	}{
		"default is 1":  {job: MakeElasticJob("j", "ns").Obj(), want: 1},
		"the GPU limit": {job: MakeElasticJob("j", "ns").GPUs(4).Obj(), want: 4},
		"spec.slotsPerWorker wins": {job: func() *etjobv1.ElasticJob {
			j := MakeElasticJob("j", "ns").GPUs(4).Obj()
			j.Spec.SlotsPerWorker = &three
			return j
		}(), want: 3},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := core.SlotsPerWorker(&tc.job.Spec); got != tc.want {
				t.Errorf("SlotsPerWorker = %d, want %d", got, tc.want)
			}
		})
	}
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
}

func TestLastCheckpointAndNoticeWindow(t *testing.T) {
	job := MakeElasticJob("j", "ns").Replicas(2).Min(1).Max(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2,
		LastCheckpoint: &etjobv1.CheckpointStatus{Step: 10}})).Obj()
	gcp := MakeNode("n1").Obj()
	gcp.Labels = map[string]string{etjobv1.LabelCloudProvider: "gcp"}
	aws := MakeNode("n0").Obj()
	aws.Spec.ProviderID = "aws:///us-east-1a/i-0123"
	ckpt := func(step int64, secs float64) string {
		return fmt.Sprintf(`{"step":%d,"path":"/ckpt/ckpt-%d.pt","time":"2026-11-29T10:00:00Z","seconds":%g}`, step, step, secs)
	}
	pods := []*corev1.Pod{
		MakeLauncher(job).Ready("od").Obj(),
		MakeWorker(job, 0).Ready("n0").Annotation(etjobv1.AnnotationCheckpoint, ckpt(40, 20)).Obj(),
		MakeWorker(job, 1).Ready("n1").Annotation(etjobv1.AnnotationCheckpoint, ckpt(30, 1)).Obj(),
	}
	nodes := map[string]*corev1.Node{"od": MakeNode("od").Obj(), "n0": aws, "n1": gcp}
	plan := core.Decide(core.Snapshot{Job: job, Pods: pods, Nodes: nodes}, t0)
	lc := plan.Status.LastCheckpoint
	if lc == nil || lc.Step != 40 || lc.Path != "/ckpt/ckpt-40.pt" || lc.DurationMilliseconds != 20000 {
		t.Fatalf("lastCheckpoint = %+v, want step 40 from j-worker-0", lc)
	}
	// 20 s fits AWS's 2 minutes but not the ~15 s GKE leaves: the job says so.
	c := cond(plan.Status, etjobv1.ConditionCheckpointTooSlow)
	if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "15s a gcp reclamation notice leaves") {
		t.Errorf("CheckpointTooSlow = %+v", c)
	}
	if len(plan.Events) == 0 || plan.Events[len(plan.Events)-1].Reason != etjobv1.ConditionCheckpointTooSlow {
		t.Errorf("events = %+v, want a CheckpointTooSlow warning", plan.Events)
	}
	// A faster checkpoint clears it; an older report never moves it back.
	job.Status = plan.Status
	pods[1] = MakeWorker(job, 1).Ready("n1").Annotation(etjobv1.AnnotationCheckpoint, ckpt(50, 2)).Obj()
	pods[2] = MakeWorker(job, 0).Ready("n0").Annotation(etjobv1.AnnotationCheckpoint, ckpt(20, 1)).Obj()
	plan = core.Decide(core.Snapshot{Job: job, Pods: pods[1:], Nodes: nodes}, t0.Add(time.Minute))
	if plan.Status.LastCheckpoint.Step != 50 || meta.IsStatusConditionTrue(plan.Status.Conditions, etjobv1.ConditionCheckpointTooSlow) {
		t.Errorf("after a fast checkpoint: %+v %+v", plan.Status.LastCheckpoint, plan.Status.Conditions)
	}
}

func TestNoticeEvent(t *testing.T) {
	job := MakeElasticJob("j", "ns").Obj()
	custom := MakeElasticJob("j", "ns").Obj()
	custom.Spec.Spot = &etjobv1.SpotSpec{PreemptionReasons: []string{"CapacityReclaim"}}
	plain := MakeWorker(job, 0).Obj()
	bestEffort := MakeWorker(job, 1).Obj()
	bestEffort.Labels[core.BestEffortQoSLabel] = "best-effort"
	cases := map[string]struct {
		job    *etjobv1.ElasticJob
		pod    *corev1.Pod
		reason string
		want   bool
	}{
		"ECI spot release":                     {job, plain, "SpotToBeReleased", true},
		"an eviction of an ordinary pod":       {job, plain, "Evicted", false},
		"an eviction of an ACS BestEffort pod": {job, bestEffort, "Evicted", true},
		"a scheduling event":                   {job, bestEffort, "Scheduled", false},
		"a reason the job lists":               {custom, plain, "CapacityReclaim", true},
		"a reason another job lists":           {job, plain, "CapacityReclaim", false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := core.NoticeEvent(tc.job, tc.pod, tc.reason); got != tc.want {
				t.Errorf("NoticeEvent(%q) = %v, want %v", tc.reason, got, tc.want)
			}
		})
	}
}
