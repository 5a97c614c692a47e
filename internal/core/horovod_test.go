package core_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	. "github.com/etjob/etjob/internal/testutil"
)

// TestDecideHorovodHandover runs the Decide cases of Horovod's rule that
// every change of horovodrun's host set keeps a host of the set before it
// (horovod.go): the members that carry the state, the stop when none can,
// and which exits of horovodrun are a release.
func TestDecideHorovodHandover(t *testing.T) {
	hvd := func() *JobWrapper { return base().Framework(etjobv1.FrameworkHorovod) }
	runningCond := []metav1.Condition{{Type: etjobv1.ConditionRunning, Status: metav1.ConditionTrue, Reason: etjobv1.ReasonMembersReady}}
	suspendedCond := []metav1.Condition{{Type: etjobv1.ConditionSuspended, Status: metav1.ConditionTrue, Reason: etjobv1.ReasonWaitingForCapacity}}
	two := etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}
	noticed := func(deadline time.Time, names ...string) map[string]*corev1.Node {
		m := nodes("od", "n0", "n1", "n2", "n3")
		for _, n := range names {
			m[n] = MakeNode(n).Notice(deadline, "aws").Obj()
		}
		return m
	}
	leaving := func(i int32, node string) *PodWrapper {
		return MakeWorker(base().Obj(), i).Ready(node).Told(t0.Add(-2*time.Second), "ReclaimNotice(aws)")
	}
	// carrier trains through its notice until 40 s before the deadline.
	carrier := func(i int32, node string) *PodWrapper {
		return leaving(i, node).Annotation(etjobv1.AnnotationStopLead, "40")
	}
	runDecideCases(t, map[string]decideCase{
		// The membership is elected again after stopBelowMin told members
		// to go (run): its rules, Horovod's among them, must see who was
		// told. Taking the told workers out of the first election instead
		// would give the stopped horovodrun w2, a host it never had.
		"a fall below min stops horovodrun, and the worker that trains through its notice beside it does not join it": {
			job: hvd().Min(3).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3, Membership: two, Conditions: runningCond})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				carrier(2, "n2").Obj(),
			},
			nodes:          noticed(t0.Add(2*time.Minute), "n2"),
			wantCreate:     []int32{3, 4},
			wantSignal:     []string{"j-worker-0", "j-launcher"},
			wantGeneration: 3,
			wantCondTrue:   []string{etjobv1.ConditionSuspended, etjobv1.ConditionResizing},
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "WaitingForCapacity",
			wantRequeue:    30 * time.Second,
			wantEvents: []wantEvent{
				normal(etjobv1.EventMembershipChanged, "generation 3: 0 members"),
				warning(etjobv1.EventWaitingForCapacity, "waiting for capacity"),
			},
		},
		"a burst of notices on every member marks horovodrun stopped, though its ranks were told by the notice": {
			job:            hvd().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: two, Conditions: runningCond})).Obj(),
			pods:           []*corev1.Pod{MakeLauncher(base().Obj()).Ready("od").Obj(), MakeWorker(base().Obj(), 0).Ready("n0").Obj(), MakeWorker(base().Obj(), 1).Ready("n1").Obj()},
			nodes:          noticed(t0.Add(20*time.Second), "n0", "n1"),
			wantCreate:     []int32{2, 3},
			wantSignal:     []string{"j-worker-0", "j-worker-1", "j-launcher"},
			wantGeneration: 3,
			wantCondTrue:   []string{etjobv1.ConditionSuspended, etjobv1.ConditionResizing},
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "WaitingForCapacity",
			wantRequeue:    30 * time.Second,
			wantEvents: []wantEvent{
				normal(etjobv1.EventMembershipChanged, "generation 3: 0 members"),
				warning(etjobv1.EventWaitingForCapacity, "waiting for capacity"),
			},
		},
		"every member leaves while joiners are ready: no joiner reaches horovodrun, the job stops for them": {
			job: hvd().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 4, Membership: two, Conditions: runningCond})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				leaving(0, "n0").Obj(), leaving(1, "n1").Obj(),
				MakeWorker(base().Obj(), 2).ReadySince("n2", t0.Add(-time.Second)).Obj(),
				MakeWorker(base().Obj(), 3).ReadySince("n3", t0.Add(-time.Second)).Obj(),
			},
			nodes:          noticed(t0.Add(18*time.Second), "n0", "n1"),
			wantSignal:     []string{"j-launcher"},
			wantGeneration: 3,
			wantCondTrue:   []string{etjobv1.ConditionSuspended, etjobv1.ConditionResizing},
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "WaitingForCapacity",
			wantRequeue:    28 * time.Second,
			wantEvents: []wantEvent{
				normal(etjobv1.EventStateHandover, "no member of horovodrun's host set stays while 2 workers are ready to join"),
				normal(etjobv1.EventMembershipChanged, "generation 3: 0 members"),
				warning(etjobv1.EventWaitingForCapacity, "waiting for capacity"),
			},
		},
		"a horovodrun told to stop is given no new host while a rank of it may still write the checkpoint": {
			job: hvd().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 4, Membership: etjobv1.MembershipStatus{Generation: 3},
				Conditions: suspendedCond})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Told(t0.Add(-10*time.Second), etjobv1.ReasonWaitingForCapacity).Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Told(t0.Add(-10*time.Second), etjobv1.ReasonWaitingForCapacity).Obj(),
				MakeWorker(base().Obj(), 2).ReadySince("n2", t0.Add(-time.Second)).Obj(),
				MakeWorker(base().Obj(), 3).ReadySince("n3", t0.Add(-time.Second)).Obj(),
			},
			nodes:          nodes("od", "n1", "n2", "n3"),
			wantCreate:     []int32{4},
			wantCondTrue:   []string{etjobv1.ConditionSuspended, etjobv1.ConditionResizing},
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "WaitingForCapacity",
			wantRequeue:    20 * time.Second,
		},
		"a horovodrun told to stop is released once no rank of it is left": {
			job: hvd().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 4, Membership: etjobv1.MembershipStatus{Generation: 3},
				Conditions: suspendedCond})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Told(t0.Add(-10*time.Second), etjobv1.ReasonWaitingForCapacity).Obj(),
				MakeWorker(base().Obj(), 2).ReadySince("n2", t0.Add(-time.Second)).Obj(),
				MakeWorker(base().Obj(), 3).ReadySince("n3", t0.Add(-time.Second)).Obj(),
			},
			nodes:          nodes("od", "n2", "n3"),
			wantDelete:     []string{"j-launcher", "j-worker-2", "j-worker-3"},
			wantRestarts:   1,
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "WaitingForCapacity",
			wantEvents:     []wantEvent{warning(etjobv1.EventRestarting, "launcher j-launcher ended after its ranks stopped (no rank of it left)")},
		},
		"horovodrun's exit before etjob marked it, every rank of it leaving, is a release": {
			job: hvd().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: two, Conditions: runningCond})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").ExitedWith(1, t0, "Process name: j-worker-0[0]\nExit code: 75\n").Obj(),
				leaving(0, "n0").Obj(), leaving(1, "n1").Obj(),
			},
			nodes:          noticed(t0.Add(18*time.Second), "n0", "n1"),
			wantDelete:     []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantGeneration: 3,
			wantRestarts:   1,
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "WaitingForCapacity",
			wantEvents: []wantEvent{
				warning(etjobv1.EventRestarting, "launcher j-launcher ended after its ranks stopped (exit code 1)"),
				normal(etjobv1.EventMembershipChanged, "generation 3: 0 members"),
			},
		},
		"horovodrun's stop on every rank failing, the first lost with its node while the others were told, is a release": {
			// The burst of session 23's failed run: two ranks told to stop
			// at a notice, the third's node taken before its loss was seen
			// (its pod still Ready), its exec ended with 255, and
			// horovodrun stopped on "failure count == 3".
			job: hvd().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3, Conditions: runningCond,
				Membership: etjobv1.MembershipStatus{Generation: 5, Hosts: []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").ExitedWith(1, t0, "ERROR:root:failure count == 3 -> stop running\n"+
					"RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job to be terminated. "+
					"The first process to do so was:\nProcess name: j-worker-1[0]\nExit code: 255\n").Obj(),
				leaving(0, "n0").Obj(), MakeWorker(base().Obj(), 1).Ready("n1").Obj(), leaving(2, "n2").Obj(),
			},
			nodes:          noticed(t0.Add(18*time.Second), "n0", "n2"),
			wantDelete:     []string{"j-launcher", "j-worker-0", "j-worker-1", "j-worker-2"},
			wantGeneration: 6,
			wantRestarts:   1,
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "WaitingForCapacity",
			wantEvents: []wantEvent{
				warning(etjobv1.EventRestarting, "launcher j-launcher ended after its ranks stopped (exit code 1)"),
				normal(etjobv1.EventMembershipChanged, "generation 6: 0 members"),
			},
		},
		"a rank killed while no rank of horovodrun's set was told to go still counts": {
			job: hvd().RestartPolicy(etjobv1.RestartPolicyOnFailure).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2, Membership: two, Conditions: runningCond})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").ExitedWith(1, t0, "Process name: j-worker-1[0]\nExit code: 137\n").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(), MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes:          nodes("od", "n0", "n1"),
			wantDelete:     []string{"j-launcher", "j-worker-0", "j-worker-1"},
			wantGeneration: 3,
			wantRestarts:   1,
			wantFailures:   1,
			wantSummary:    "Restarting",
			wantEvents: []wantEvent{
				warning(etjobv1.EventRestarting, "launcher j-launcher lost (exit code 1"),
				normal(etjobv1.EventMembershipChanged, "generation 3: 0 members"),
			},
		},
		"horovodrun's own words for a host set with none of its own are a release": {
			job: hvd().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 4, Conditions: runningCond,
				Membership: etjobv1.MembershipStatus{Generation: 4, Hosts: []string{"j-worker-2:1", "j-worker-3:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").ExitedWith(1, t0, "RuntimeError: No hosts from previous set remaining, unable to broadcast state.\nfailed to activate new hosts -> stop running").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(), MakeWorker(base().Obj(), 3).Ready("n3").Obj(),
			},
			nodes:          nodes("od", "n2", "n3"),
			wantDelete:     []string{"j-launcher", "j-worker-2", "j-worker-3"},
			wantGeneration: 5,
			wantRestarts:   1,
			wantCondReason: map[string]string{etjobv1.ConditionSuspended: etjobv1.ReasonWaitingForCapacity},
			wantSummary:    "WaitingForCapacity",
			wantEvents: []wantEvent{
				warning(etjobv1.EventRestarting, "launcher j-launcher ended after its ranks stopped (exit code 1)"),
				normal(etjobv1.EventMembershipChanged, "generation 5: 0 members"),
			},
		},
		"a rank that failed on its own still counts after etjob stopped horovodrun": {
			job: hvd().RestartPolicy(etjobv1.RestartPolicyOnFailure).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 3}, Conditions: suspendedCond})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Node("od").Told(t0.Add(-10*time.Second), etjobv1.ReasonWaitingForCapacity).
					ExitedWith(1, t0, "Process name: j-worker-2[0]\nExit code: 1\n").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes:          nodes("od", "n2"),
			wantDelete:     []string{"j-launcher", "j-worker-2"},
			wantRestarts:   1,
			wantFailures:   1,
			wantCondReason: map[string]string{etjobv1.ConditionRunning: etjobv1.ReasonRestarting},
			wantSummary:    "WaitingForCapacity",
			wantEvents:     []wantEvent{warning(etjobv1.EventRestarting, "launcher j-launcher lost (exit code 1")},
		},
		"a joiner joins at once beside members training through their notices, and takes the state from them": {
			job: hvd().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3, Membership: two, Conditions: runningCond})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				carrier(0, "n0").Obj(), carrier(1, "n1").Obj(),
				MakeWorker(base().Obj(), 2).ReadySince("n2", t0.Add(-time.Second)).Obj(),
			},
			nodes:          noticed(t0.Add(2*time.Minute), "n0", "n1"),
			wantCreate:     []int32{3},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"},
			wantGeneration: 3,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    80 * time.Second,
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 3: 3 members")},
		},
		"a joiner that comes too late to take the state waits for the members' stop": {
			job: hvd().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3, Membership: two, Conditions: runningCond})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				carrier(0, "n0").Obj(), carrier(1, "n1").Obj(),
				MakeWorker(base().Obj(), 2).ReadySince("n2", t0.Add(-time.Second)).Obj(),
			},
			nodes:        noticed(t0.Add(50*time.Second), "n0", "n1"),
			wantCreate:   []int32{3},
			wantHosts:    []string{"j-worker-0:1", "j-worker-1:1"},
			wantCondTrue: []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:  "Resizing",
			wantRequeue:  10 * time.Second,
		},
	})
}
