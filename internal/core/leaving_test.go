package core_test

import (
	"fmt"
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
		"a cordoned node (kubectl drain) is a notice without deadline: its worker leaves at the next agreed step": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(), "n2": MakeNode("n2").Obj(),
				"n1": MakeNode("n1").Cordon().Obj(),
			},
			wantCreate:     []int32{3},
			wantSignal:     []string{"j-worker-1"},
			wantHosts:      []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration: 3,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantRequeue:    30 * time.Second,
			wantSummary:    "Resizing",
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 3: 2 members")},
		},
		"Karpenter's disrupted taint (consolidation) is a notice without deadline too": {
			job: base().Status(running(etjobv1.ElasticJobStatus{NextWorkerIndex: 3,
				Membership: etjobv1.MembershipStatus{Generation: 2, Hosts: []string{"j-worker-0:1", "j-worker-1:1", "j-worker-2:1"}}})).Obj(),
			pods: []*corev1.Pod{
				MakeLauncher(base().Obj()).Ready("od").Obj(),
				MakeWorker(base().Obj(), 0).Ready("n0").Obj(),
				MakeWorker(base().Obj(), 1).Ready("n1").Obj(),
				MakeWorker(base().Obj(), 2).Ready("n2").Obj(),
			},
			nodes: map[string]*corev1.Node{
				"od": MakeNode("od").Obj(), "n0": MakeNode("n0").Obj(), "n1": MakeNode("n1").Obj(),
				"n2": MakeNode("n2").Taint("karpenter.sh/disrupted").Obj(),
			},
			wantCreate:     []int32{3},
			wantSignal:     []string{"j-worker-2"},
			wantHosts:      []string{"j-worker-0:1", "j-worker-1:1"},
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
			job:        noticeJob(2, 2, 4200),
			pods:       onNoticedNode(2, nil),
			nodes:      noticedNodes(2, t0.Add(2*time.Minute), "aws"),
			wantSignal: []string{"j-worker-1"},
			// 4.2 s rounded up to 5, plus the default margin of 15.
			wantStopLead:   map[string]time.Duration{"j-worker-1": 20 * time.Second},
			wantCreate:     []int32{2},
			wantHosts:      hosts(2),
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    30 * time.Second,
		},
		"a noticed worker before its stop time stays a member; the pass looks again at the stop time": {
			job: noticeJob(2, 3, 0),
			pods: append(onNoticedNode(2, func(p *PodWrapper) *PodWrapper {
				return p.Told(t0.Add(-40*time.Second), "ReclaimNotice(aws)").Annotation(etjobv1.AnnotationStopLead, "20")
			}), MakeWorker(base().Obj(), 2).Obj()),
			nodes:          noticedNodes(2, t0.Add(80*time.Second), "aws"),
			wantHosts:      hosts(2),
			wantGeneration: 1,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    60 * time.Second,
		},
		"at its stop time a noticed worker leaves the membership": {
			job: noticeJob(3, 3, 0),
			pods: onNoticedNode(3, func(p *PodWrapper) *PodWrapper {
				return p.Told(t0.Add(-100*time.Second), "ReclaimNotice(aws)").Annotation(etjobv1.AnnotationStopLead, "20")
			}),
			nodes:          noticedNodes(3, t0.Add(20*time.Second), "aws"),
			wantHosts:      []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration: 2,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    20 * time.Second,
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 2: 2 members")},
		},
		"a deadline the cloud moves earlier moves the stop with it": {
			job: noticeJob(3, 3, 0),
			// Told 10 s ago with 3 minutes left; the deadline is now 15 s away.
			pods: onNoticedNode(3, func(p *PodWrapper) *PodWrapper {
				return p.Told(t0.Add(-10*time.Second), "ReclaimNotice(aws)").Annotation(etjobv1.AnnotationStopLead, "20")
			}),
			nodes:          noticedNodes(3, t0.Add(15*time.Second), "aws"),
			wantHosts:      []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration: 2,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    20 * time.Second, // the grace period: the deadline is sooner
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 2: 2 members")},
		},
		"noticeLeadTime Stop stops a noticed worker at the next step": {
			job: func() *etjobv1.ElasticJob {
				j := noticeJob(3, 3, 4200)
				j.Spec.Spot = &etjobv1.SpotSpec{Enabled: true, LeaveGracePeriodSeconds: 30, NoticeLeadTime: etjobv1.NoticeLeadTimeStop}
				return j
			}(),
			pods:           onNoticedNode(3, nil),
			nodes:          noticedNodes(3, t0.Add(2*time.Minute), "aws"),
			wantSignal:     []string{"j-worker-1"},
			wantHosts:      []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration: 2,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    30 * time.Second,
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 2: 2 members")},
		},
		"a notice too short for the checkpoint and the margin stops at once": {
			job:            noticeJob(3, 3, 4200),
			pods:           onNoticedNode(3, nil),
			nodes:          noticedNodes(3, t0.Add(20*time.Second), "azure"),
			wantSignal:     []string{"j-worker-1"},
			wantHosts:      []string{"j-worker-0:1", "j-worker-2:1"},
			wantGeneration: 2,
			wantCondTrue:   []string{etjobv1.ConditionRunning, etjobv1.ConditionResizing},
			wantSummary:    "Resizing",
			wantRequeue:    30 * time.Second,
			wantEvents:     []wantEvent{normal(etjobv1.EventMembershipChanged, "generation 2: 2 members")},
		},
		"GKE keeps 15 s of GCP's notice back: the lead counts them": {
			job:            noticeJob(2, 2, 2000),
			pods:           onNoticedNode(2, nil),
			nodes:          noticedNodes(2, t0.Add(time.Minute), "gcp"),
			wantSignal:     []string{"j-worker-1"},
			wantStopLead:   map[string]time.Duration{"j-worker-1": 32 * time.Second},
			wantCreate:     []int32{2},
			wantHosts:      hosts(2),
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

// hosts are the membership of workers 0..n-1.
func hosts(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("j-worker-%d:1", i))
	}
	return out
}

// noticeJob is base() at replicas 2, running with members 0..members-1 and
// next index next; a last checkpoint that took ckptMillis (none if 0).
func noticeJob(members int, next int32, ckptMillis int64) *etjobv1.ElasticJob {
	st := etjobv1.ElasticJobStatus{NextWorkerIndex: next, Membership: etjobv1.MembershipStatus{Generation: 1, Hosts: hosts(members)}}
	if ckptMillis > 0 {
		st.LastCheckpoint = &etjobv1.CheckpointStatus{Step: 40, DurationMilliseconds: ckptMillis}
	}
	return base().Replicas(2).Status(running(st)).Obj()
}

// onNoticedNode is the launcher on od and workers 0..n-1 ready on n0..;
// worker 1, on the noticed n1, through tweak (if any).
func onNoticedNode(n int, tweak func(*PodWrapper) *PodWrapper) []*corev1.Pod {
	pods := []*corev1.Pod{MakeLauncher(base().Obj()).Ready("od").Obj()}
	for i := range n {
		w := MakeWorker(base().Obj(), int32(i)).Ready(fmt.Sprintf("n%d", i))
		if i == 1 && tweak != nil {
			w = tweak(w)
		}
		pods = append(pods, w.Obj())
	}
	return pods
}

// noticedNodes are od and n0..n-1, n1 with a notice of cloud until deadline.
func noticedNodes(n int, deadline time.Time, cloud string) map[string]*corev1.Node {
	out := map[string]*corev1.Node{"od": MakeNode("od").Obj()}
	for i := range n {
		out[fmt.Sprintf("n%d", i)] = MakeNode(fmt.Sprintf("n%d", i)).Obj()
	}
	out["n1"] = MakeNode("n1").Notice(deadline, cloud).Label(etjobv1.LabelCloudProvider, cloud).Obj()
	return out
}
