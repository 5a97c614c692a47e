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

// TestDecideLauncher runs the Decide cases of the launcher: its loss, its move
// off a noticed node, horovodrun's start, stop and release (launcher.go).
func TestDecideLauncher(t *testing.T) {
	runDecideCases(t, map[string]decideCase{
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
			wantEvents: []wantEvent{
				warning(etjobv1.EventRestarting, "restarting the job (restart 1): launcher j-launcher lost (exit code 1)"),
				normal(etjobv1.EventMembershipChanged, "generation 3: 0 members"),
			},
		},
		"a launcher lost with its node restarts the job even under restartPolicy Never: a preemption, not a failure": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("gone").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes:           nodes("n0", "n1"),
			wantDelete:      []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantRestarts:    1,
			wantPreemptions: 1,
			wantCondReason:  map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonRestarting},
			wantSummary:     "Restarting",
			wantEvents:      []wantEvent{warning(etjobv1.EventRestarting, "restarting the job (restart 1): launcher j-launcher lost (NodeLost)")},
		},
		"a launcher deleted by someone else while its workers are members restarts the job at once, not a failure": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2,
				Membership: etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Deleting(t0).Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes:          nodes("od", "n0", "n1"),
			wantDelete:     []string{"j-worker-0", "j-worker-1"},
			wantGeneration: 3,
			wantRestarts:   1,
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonRestarting},
			wantSummary:    "Restarting",
			wantEvents: []wantEvent{
				warning(etjobv1.EventRestarting, "restarting the job (restart 1): launcher j-launcher deleted while 2 workers were members: the rendezvous store is lost"),
				normal(etjobv1.EventMembershipChanged, "generation 3: 0 members"),
			},
		},
		"a launcher gone while its workers are members (deleted with no grace period) restarts the job, not a failure": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2,
				Membership: etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes:          nodes("n0", "n1"),
			wantDelete:     []string{"j-worker-0", "j-worker-1"},
			wantGeneration: 3,
			wantRestarts:   1,
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonRestarting},
			wantSummary:    "Restarting",
			wantEvents: []wantEvent{
				warning(etjobv1.EventRestarting, "restarting the job (restart 1): the launcher is gone while 2 workers were members"),
				normal(etjobv1.EventMembershipChanged, "generation 3: 0 members"),
			},
		},
		"a new job's launcher is created beside its workers: no members, no store lost": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2})).Obj(),
			pods: []*corev1.Pod{
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes:          nodes("n0", "n1"),
			wantLauncher:   true,
			wantCreate:     []int32{2},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 1: 2 members")},
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
			wantEvents: []wantEvent{
				normal(etjobv1.EventLauncherMoving, "the node of launcher j-launcher is being reclaimed (ReclaimNotice(aws)): the workers"),
				normal(etjobv1.EventMembershipChanged, "generation 3: 0 members"),
			},
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
			wantEvents:      []wantEvent{warning(etjobv1.EventRestarting, "the node of launcher j-launcher is being reclaimed (ReclaimNotice(aws)): restarting from the last checkpoint")},
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
			wantEvents:      []wantEvent{warning(etjobv1.EventRestarting, "restarting the job (restart 1): launcher j-launcher lost (ReclaimNotice(gcp))")},
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
			wantEvents:      []wantEvent{warning(etjobv1.EventRestarting, "restarting the job (restart 1): launcher j-launcher lost (NodeLost)")},
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
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 1: 2 members")},
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
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 1: 2 members")},
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
			wantEvents:     []wantEvent{warning(etjobv1.EventFailed, "could not run its command (exit code 127: the image does not have it, or it is not executable): sh: 1: horovodrun: not found")},
		},
		"a horovod launcher that does not run horovodrun fails the job": {
			job:            base().Framework(etjobv1.FrameworkHorovod).LauncherCommand("python", "train.py").Obj(),
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantCondReason: map[string]string{etjobv1.ConditionFailed: etjobv1.ReasonInvalidLauncher},
			wantSummary:    "Failed",
			wantEvents:     []wantEvent{warning(etjobv1.EventFailed, "a horovod job's launcher must run horovodrun")},
		},
		"a pod the API server refused as invalid fails the job at once": {
			job: base().Status(etjobv1.ElasticJobStatus{Conditions: []metav1.Condition{{Type: etjobv1.ConditionCreateRefused, Status: metav1.ConditionTrue,
				Reason: etjobv1.ReasonPodTemplateInvalid, Message: `creating pod j-worker-0: Pod "j-worker-0" is invalid: spec.containers[0].volumeMounts[1].mountPath: Invalid value: "/data": must be unique`}}}).Obj(),
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantCondReason: map[string]string{etjobv1.ConditionFailed: etjobv1.ReasonPodTemplateInvalid},
			wantSummary:    "Failed",
			wantEvents:     []wantEvent{warning(etjobv1.EventFailed, "spec.containers[0].volumeMounts[1].mountPath: Invalid value")},
		},
		"a pod refused for a quota does not fail the job": {
			job: base().Status(etjobv1.ElasticJobStatus{Conditions: []metav1.Condition{{Type: etjobv1.ConditionCreateRefused, Status: metav1.ConditionTrue,
				Reason: etjobv1.ReasonPodCreateRefused, Message: `creating pod j-worker-0: pods "j-worker-0" is forbidden: exceeded quota`}}}).Obj(),
			wantCreate:   []int32{0, 1, 2},
			wantLauncher: true,
			wantSummary:  "Pending",
		},
		"a discovery script etjob does not provide fails the job at once": {
			job:            base().Framework(etjobv1.FrameworkHorovod).LauncherCommand("sh", "-c", "horovodrun -np 2 --host-discovery-script /etc/edl/discover.sh python t.py").Obj(),
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantCondReason: map[string]string{etjobv1.ConditionFailed: etjobv1.ReasonInvalidLauncher},
			wantSummary:    "Failed",
			wantEvents:     []wantEvent{warning(etjobv1.EventFailed, "--host-discovery-script /etc/edl/discover.sh does not exist")},
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
			wantEvents:     []wantEvent{warning(etjobv1.EventRestarting, "launcher j-launcher ended after its ranks stopped (exit code 1)")},
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
			wantEvents:     []wantEvent{warning(etjobv1.EventRestarting, "launcher j-launcher ended after its ranks stopped (exit code 1)")},
		},
	})
}

// TestDecideInProcessLauncher runs the Decide cases of a spec.recovery
// InProcess job's launcher: replaced alone, its workers untouched
// (replaceLauncher).
func TestDecideInProcessLauncher(t *testing.T) {
	job := func() *JobWrapper { return base().Recovery(etjobv1.RecoveryInProcess) }
	members := etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}
	workers := func() []*corev1.Pod {
		return []*corev1.Pod{MakeWorker(job().Obj(), 0).Ready("n0").Obj(), MakeWorker(job().Obj(), 1).Ready("n1").Obj()}
	}
	runDecideCases(t, map[string]decideCase{
		"a lost launcher is replaced alone: a preemption, no failure, no restart": {
			job:             job().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: members})).Obj(),
			pods:            append(workers(), MakeLauncher(job().Obj()).Ready("gone").Obj()),
			nodes:           nodes("n0", "n1"),
			wantDelete:      []string{"j-launcher"},
			wantHosts:       []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration:  2,
			wantCondTrue:    []string{etjobv1.ConditionRunning},
			wantPreemptions: 1,
			wantSummary:     "Running",
			wantEvents:      []wantEvent{normal(etjobv1.EventLauncherReplaced, "launcher j-launcher lost (NodeLost); replacing the launcher alone")},
		},
		"a noticed launcher is replaced at once, the workers told nothing": {
			job:  job().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: members})).Obj(),
			pods: append(workers(), MakeLauncher(job().Obj()).Ready("od").Obj()),
			nodes: map[string]*corev1.Node{"od": MakeNode("od").Notice(t0.Add(2*time.Minute), "aws").Obj(),
				"n0": MakeNode("n0").Obj(), "n1": MakeNode("n1").Obj()},
			wantDelete:      []string{"j-launcher"},
			wantHosts:       []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration:  2,
			wantCondTrue:    []string{etjobv1.ConditionRunning},
			wantPreemptions: 1,
			wantSummary:     "Running",
			wantEvents:      []wantEvent{normal(etjobv1.EventLauncherReplaced, "the node of launcher j-launcher is being reclaimed (ReclaimNotice(aws)); replacing the launcher alone")},
		},
		"a launcher on a drained node (kubectl drain) is replaced at once, the workers told nothing": {
			job:  job().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: members})).Obj(),
			pods: append(workers(), MakeLauncher(job().Obj()).Ready("od").Obj()),
			nodes: map[string]*corev1.Node{"od": MakeNode("od").Cordon().Obj(),
				"n0": MakeNode("n0").Obj(), "n1": MakeNode("n1").Obj()},
			wantDelete:      []string{"j-launcher"},
			wantHosts:       []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration:  2,
			wantCondTrue:    []string{etjobv1.ConditionRunning},
			wantPreemptions: 1,
			wantSummary:     "Running",
			wantEvents:      []wantEvent{normal(etjobv1.EventLauncherReplaced, "the node of launcher j-launcher is being reclaimed (NodeDrain(node.kubernetes.io/unschedulable)); replacing the launcher alone")},
		},
		"a launcher that exited non-zero on its own is a failure, and is still replaced alone": {
			job:              job().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: members, LauncherReplacements: 1})).Obj(),
			pods:             append(workers(), MakeLauncher(job().Obj()).Node("od").Exited(1, t0).Obj()),
			nodes:            nodes("od", "n0", "n1"),
			wantDelete:       []string{"j-launcher"},
			wantHosts:        []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration:   2,
			wantCondTrue:     []string{etjobv1.ConditionRunning},
			wantFailures:     1,
			wantReplacements: 1,
			wantSummary:      "Running",
			wantEvents:       []wantEvent{warning(etjobv1.EventLauncherReplaced, "launcher j-launcher lost (exit code 1); replacing the launcher alone")},
		},
		"a launcher failure beyond backoffLimit fails the job": {
			job:            job().Replicas(2).BackoffLimit(0).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: members})).Obj(),
			pods:           append(workers(), MakeLauncher(job().Obj()).Node("od").Exited(1, t0).Obj()),
			nodes:          nodes("od", "n0", "n1"),
			wantDelete:     []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantGeneration: 3,
			wantFailures:   1,
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantSummary:    "Failed",
			wantEvents: []wantEvent{warning(etjobv1.EventFailed, "launcher j-launcher lost (exit code 1); 1 failures exceed spec.backoffLimit (0)"),
				normal(etjobv1.EventMembershipChanged, "generation 3: 0 members")},
		},
		"a launcher whose image lacks its command fails the job at once": {
			job:            job().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: members})).Obj(),
			pods:           append(workers(), MakeLauncher(job().Obj()).Node("od").Exited(127, t0).Obj()),
			nodes:          nodes("od", "n0", "n1"),
			wantDelete:     []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantGeneration: 3,
			wantFailures:   1,
			wantCondTrue:   []string{etjobv1.ConditionFailed},
			wantSummary:    "Failed",
			wantEvents: []wantEvent{warning(etjobv1.EventFailed, "launcher j-launcher could not run its command (exit code 127"),
				normal(etjobv1.EventMembershipChanged, "generation 3: 0 members")},
		},
		"a launcher being deleted holds nothing up: the workers train on": {
			job:            job().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: members, LauncherReplacements: 1})).Obj(),
			pods:           append(workers(), MakeLauncher(job().Obj()).Ready("od").Deleting(t0).Obj()),
			nodes:          nodes("od", "n0", "n1"),
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 2,
			wantCondTrue:   []string{etjobv1.ConditionRunning},
			wantSummary:    "Running",
			// the count stays: the replacement is made once the name is free
			wantReplacements: 1,
		},
		"the first launcher of an attempt is no replacement": {
			job:          job().Replicas(2).Status(running(etjobv1.ElasticJobStatus{})).Obj(),
			nodes:        nodes("n0", "n1"),
			wantLauncher: true,
			wantCreate:   []int32{0, 1},
			wantSummary:  "Pending",
		},
		"the replacement launcher is created while the workers train on": {
			job:              job().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: members, LauncherReplacements: 1})).Obj(),
			pods:             workers(),
			nodes:            nodes("n0", "n1"),
			wantLauncher:     true,
			wantHosts:        []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration:   2,
			wantCondTrue:     []string{etjobv1.ConditionRunning},
			wantSummary:      "Running",
			wantReplacements: 2,
		},
	})
}
