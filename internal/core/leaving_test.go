package core_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	. "github.com/etjob/etjob/internal/testutil"
)

// TestDecideLeaving runs the Decide cases of workers told to leave, their grace
// period, and pods on NotReady nodes (leaving.go).
func TestDecideLeaving(t *testing.T) {
	runDecideCases(t, map[string]decideCase{
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
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 3: 2 members")},
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
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 1: 1 members")},
		},
		"a noticed worker trains through its notice: a member until deadline - (checkpoint + margin), and a replacement starts": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2,
				LastCheckpoint: &etjobv1.CheckpointStatus{Step: 40, DurationMilliseconds: 4200},
				Membership:     etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(),
				"n1": MakeNode("n1").Notice(t0.Add(2*time.Minute), "aws").Obj(),
			},
			wantSignal: []string{"j-worker-1"},
			// 4.2 s rounded up to 5, plus the default margin of 15.
			wantStopLead:   map[string]time.Duration{"j-worker-1": 20 * time.Second},
			wantCreate:     []int32{2},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    30 * time.Second,
		},
		"a noticed worker before its stop time stays a member; the pass looks again at the stop time": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Told(t0.Add(-40*time.Second), "ReclaimNotice(aws)").Annotation(etjobv1.AnnotationStopLead, "20").Obj(),
				MakeWorker(base().Obj(), 2).Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(),
				"n1": MakeNode("n1").Notice(t0.Add(80*time.Second), "aws").Obj(),
			},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    60 * time.Second,
		},
		"at its stop time a noticed worker leaves the membership": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Told(t0.Add(-100*time.Second), "ReclaimNotice(aws)").Annotation(etjobv1.AnnotationStopLead, "20").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(), "n2": MakeNode("n2").Obj(),
				"n1": MakeNode("n1").Notice(t0.Add(20*time.Second), "aws").Obj(),
			},
			wantHosts:      []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration: 2,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    20 * time.Second,
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 2: 2 members")},
		},
		"a deadline the cloud moves earlier moves the stop with it": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				// Told 10 s ago with 3 minutes left; the deadline is now 15 s away.
				MakeWorker(base().Obj(), 1).Ready("n1").Told(t0.Add(-10*time.Second), "ReclaimNotice(aws)").Annotation(etjobv1.AnnotationStopLead, "20").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(), "n2": MakeNode("n2").Obj(),
				"n1": MakeNode("n1").Notice(t0.Add(15*time.Second), "aws").Obj(),
			},
			wantHosts:      []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration: 2,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    20 * time.Second, // the grace period: the deadline is sooner
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 2: 2 members")},
		},
		"noticeLeadTime Stop stops a noticed worker at the next step": {
			job: base().Replicas(2).Spot(etjobv1.SpotSpec{Enabled: true, LeaveGracePeriodSeconds: 30, NoticeLeadTime: etjobv1.NoticeLeadTimeStop}).
				Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
					LastCheckpoint: &etjobv1.CheckpointStatus{Step: 40, DurationMilliseconds: 4200},
					Membership:     etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(), "n2": MakeNode("n2").Obj(),
				"n1": MakeNode("n1").Notice(t0.Add(2*time.Minute), "aws").Obj(),
			},
			wantSignal:     []string{"j-worker-1"},
			wantHosts:      []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration: 2,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    30 * time.Second,
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 2: 2 members")},
		},
		"a notice too short for the checkpoint and the margin stops at once": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				LastCheckpoint: &etjobv1.CheckpointStatus{Step: 40, DurationMilliseconds: 4200},
				Membership:     etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(), "n2": MakeNode("n2").Obj(),
				"n1": MakeNode("n1").Notice(t0.Add(20*time.Second), "azure").Obj(),
			},
			wantSignal:     []string{"j-worker-1"},
			wantHosts:      []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration: 2,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    30 * time.Second,
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 2: 2 members")},
		},
		"GKE keeps 15 s of GCP's notice back: the lead counts them": {
			job: base().Replicas(2).Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 2,
				LastCheckpoint: &etjobv1.CheckpointStatus{Step: 40, DurationMilliseconds: 2000},
				Membership:     etjobv1.MembershipStatus{Generation: 1, Hosts: []string{"j-worker-0:1", "j-worker-1:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(),
				"n1": MakeNode("n1").Notice(t0.Add(time.Minute), "gcp").Label(etjobv1.LabelCloudProvider, "gcp").Obj(),
			},
			wantSignal:     []string{"j-worker-1"},
			wantStopLead:   map[string]time.Duration{"j-worker-1": 32 * time.Second},
			wantCreate:     []int32{2},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    28 * time.Second,
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
			wantEvents: []wantEvent{
				normal(etjobv1.EventPreempted, "worker j-worker-1 preempted (LeaveGracePeriodExpired); not counted as a failure"),
				normal(etjobv1.EventMembershipChanged, "generation 1: 2 members"),
			},
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
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 1: 2 members")},
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
			wantEvents: []wantEvent{
				normal(etjobv1.EventPreempted, "worker j-worker-1 preempted (NodeNotReady); not counted as a failure"),
				normal(etjobv1.EventMembershipChanged, "generation 1: 1 members"),
			},
		},
	})
}
