package core_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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

// base is the job most Decide cases start from.
func base() *JobWrapper { return MakeElasticJob("j", "ns").Replicas(3).Min(2).Max(4) }

// decideCase is one call of Decide and what its plan must be. The per-policy
// test files (launcher_test.go, failures_test.go, ...) hold the cases.
type decideCase struct {
	job   *etjobv1.ElasticJob
	pods  []*corev1.Pod
	nodes map[string]*corev1.Node
	// podNotices are pod-level notices (Events), by pod name.
	podNotices map[string]string
	now        time.Time

	wantLauncher bool
	wantCreate   []int32
	wantDelete   []string
	wantSignal   []string
	// wantStopLead are the signals' stop leads (etjob.dev/stop-lead), by
	// pod; a signal missing here must have none.
	wantStopLead    map[string]time.Duration
	wantHosts       []string
	wantGeneration  int64
	wantCondTrue    []string
	wantCondReason  map[string]string
	wantSummary     string
	wantRestarts    int32
	wantFailures    int32
	wantPreemptions int32
	// wantReplacements is status.launcherReplacements after the pass.
	wantReplacements int32
	wantRequeue      time.Duration
	wantDeleteJob    bool
	// wantEvents are the plan's Events, in order; none when empty.
	wantEvents []wantEvent
}

// wantEvent is an Event a plan must emit: its type and reason, and a part of
// its message ("" for any).
type wantEvent struct {
	warning bool
	reason  etjobv1.EventReason
	message string
}

// normal is a Normal Event whose message contains msg.
func normal(reason etjobv1.EventReason, msg string) wantEvent {
	return wantEvent{reason: reason, message: msg}
}

// warning is a Warning Event whose message contains msg.
func warning(reason etjobv1.EventReason, msg string) wantEvent {
	return wantEvent{warning: true, reason: reason, message: msg}
}

// checkEvents reports where the plan's Events differ from want.
func checkEvents(t *testing.T, want []wantEvent, got []core.Event) {
	t.Helper()
	ok := len(want) == len(got)
	for i := 0; ok && i < len(want); i++ {
		ok = want[i].warning == got[i].Warning && want[i].reason == got[i].Reason && strings.Contains(got[i].Message, want[i].message)
	}
	if !ok {
		t.Errorf("Events = %+v,\nwant %+v", got, want)
	}
}

// runDecideCases runs Decide on every case and checks its plan.
func runDecideCases(t *testing.T, cases map[string]decideCase) {
	t.Helper()
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
			leads := map[string]time.Duration{}
			for _, s := range plan.Signal {
				if s.StopLead != 0 {
					leads[s.Pod] = s.StopLead
				}
			}
			if diff := cmp.Diff(tc.wantStopLead, leads, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("stop leads (-want +got):\n%s", diff)
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
			if st.LauncherReplacements != tc.wantReplacements {
				t.Errorf("launcherReplacements = %d, want %d", st.LauncherReplacements, tc.wantReplacements)
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
			checkEvents(t, tc.wantEvents, plan.Events)
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
			if got := etjobv1.SlotsPerWorker(&tc.job.Spec); got != tc.want {
				t.Errorf("SlotsPerWorker = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestPodNoticeEvent (N2): a pod-level notice Event counts only when it
// names the pod's own UID and the pod is on a node that no etjob agent
// serves (a virtual node); an unbound pod has none, nor a launcher (M2).
func TestPodNoticeEvent(t *testing.T) {
	job := MakeElasticJob("j", "ns").Obj()
	pod := MakeWorker(job, 0).Obj()
	pod.UID = "pod-uid"
	pod.Spec.NodeName = "virtual-kubelet"
	isNode := func(name string) bool { return name == "virtual-kubelet" || name == "spot-1" }
	from := func(ev *corev1.Event, host, instance string) *corev1.Event {
		ev.Source.Host, ev.ReportingInstance = host, instance
		return ev
	}
	launcher := MakeLauncher(job).Obj()
	launcher.UID = "pod-uid"
	virtual := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "virtual-kubelet", Labels: map[string]string{"type": "virtual-kubelet"}}}
	served := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "spot-1", Annotations: map[string]string{etjobv1.AnnotationNodeAgent: "true"}}}
	event := func(uid types.UID, reason string) *corev1.Event {
		return &corev1.Event{InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: pod.Name, UID: uid}, Reason: reason}
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		node *corev1.Node
		ev   *corev1.Event
		want bool
	}{
		{"the pod's own, on a virtual node", pod, virtual, event("pod-uid", "SpotToBeReleased"), true},
		{"no UID", pod, virtual, event("", "SpotToBeReleased"), false},
		{"an earlier pod's UID", pod, virtual, event("earlier-uid", "SpotToBeReleased"), false},
		{"on a node an agent serves", pod, served, event("pod-uid", "SpotToBeReleased"), false},
		{"no node yet", pod, nil, event("pod-uid", "SpotToBeReleased"), false},
		{"not a notice reason", pod, virtual, event("pod-uid", "Scheduled"), false},
		// M2: any kubelet may post it, and a launcher's move restarts the job.
		{"about the launcher", launcher, virtual, event("pod-uid", "SpotToBeReleased"), false},
		// M2: a kubelet names its own node (the chart's admission policy)
		{"from the pod's own node", pod, virtual, from(event("pod-uid", "SpotToBeReleased"), "virtual-kubelet", ""), true},
		{"from another node", pod, virtual, from(event("pod-uid", "SpotToBeReleased"), "spot-1", ""), false},
		{"from another node, events.k8s.io", pod, virtual, from(event("pod-uid", "SpotToBeReleased"), "", "spot-1"), false},
		{"from an instance, not a node", pod, virtual, from(event("pod-uid", "SpotToBeReleased"), "eci-2ze0abc", ""), true},
	} {
		if got := core.PodNoticeEvent(job, tc.pod, tc.node, tc.ev, isNode); got != tc.want {
			t.Errorf("%s: PodNoticeEvent = %v, want %v", tc.name, got, tc.want)
		}
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
