package agent

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/agent/notice"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestDecide(t *testing.T) {
	reclaim := notice.Notice{Kind: notice.Reclaim, Deadline: now.Add(2 * time.Minute), Source: "aws"}
	warning := notice.Notice{Kind: notice.EarlyWarning, Source: "gcp"}
	leave := map[string]string{etjobv1.AnnotationLeave: now.Format(time.RFC3339), etjobv1.AnnotationLeaveReason: etjobv1.ReasonScaleIn}
	testCases := map[string]struct {
		state NodeState
		ann   map[string]string
		want  Signal
	}{
		"nothing": {
			want: Signal{Action: ActionNone},
		},
		"node reclaim": {
			state: NodeState{Reclaim: reclaim},
			want:  Signal{Action: ActionLeave, Reason: "ReclaimNotice(aws)", Deadline: "2026-11-29T12:02:00Z", Source: "aws"},
		},
		"node reclaim wins over the controller and a warning": {
			state: NodeState{Reclaim: reclaim, Warning: warning},
			ann:   leave,
			want:  Signal{Action: ActionLeave, Reason: "ReclaimNotice(aws)", Deadline: "2026-11-29T12:02:00Z", Source: "aws"},
		},
		"node reclaim, a pod that may train through it, before the controller answered: a checkpoint first": {
			state: NodeState{Reclaim: reclaim, ReclaimSince: now.Add(-2 * time.Second)},
			ann:   map[string]string{etjobv1.AnnotationNoticeLeadTime: "Train"},
			want:  Signal{Action: ActionCheckpoint, Reason: "ReclaimNotice(aws)", Deadline: "2026-11-29T12:02:00Z", Source: "aws"},
		},
		"node reclaim, a pod that may train through it, the controller silent for StopLeadWait: stop now": {
			state: NodeState{Reclaim: reclaim, ReclaimSince: now.Add(-StopLeadWait)},
			ann:   map[string]string{etjobv1.AnnotationNoticeLeadTime: "Train"},
			want:  Signal{Action: ActionLeave, Reason: "ReclaimNotice(aws)", Deadline: "2026-11-29T12:02:00Z", Source: "aws"},
		},
		"node reclaim, the controller said stop now (a leave without a lead)": {
			state: NodeState{Reclaim: reclaim, ReclaimSince: now},
			ann:   map[string]string{etjobv1.AnnotationNoticeLeadTime: "Train", etjobv1.AnnotationLeave: now.Format(time.RFC3339)},
			want:  Signal{Action: ActionLeave, Reason: "ReclaimNotice(aws)", Deadline: "2026-11-29T12:02:00Z", Source: "aws"},
		},
		"node reclaim with the controller's stop lead: train until that long before the deadline": {
			state: NodeState{Reclaim: reclaim, ReclaimSince: now},
			ann: map[string]string{etjobv1.AnnotationNoticeLeadTime: "Train", etjobv1.AnnotationLeave: now.Format(time.RFC3339),
				etjobv1.AnnotationStopLead: "25"},
			want: Signal{Action: ActionLeave, Reason: "ReclaimNotice(aws)", Deadline: "2026-11-29T12:02:00Z", Source: "aws",
				StopAt: "2026-11-29T12:01:35Z"},
		},
		"controller leave": {
			ann:  leave,
			want: Signal{Action: ActionLeave, Reason: etjobv1.ReasonScaleIn, Source: SourceController},
		},
		"controller leave without a reason": {
			ann:  map[string]string{etjobv1.AnnotationLeave: now.Format(time.RFC3339)},
			want: Signal{Action: ActionLeave, Reason: "Leave", Source: SourceController},
		},
		"controller leave wins over a warning": {
			state: NodeState{Warning: warning},
			ann:   leave,
			want:  Signal{Action: ActionLeave, Reason: etjobv1.ReasonScaleIn, Source: SourceController},
		},
		"early warning": {
			state: NodeState{Warning: warning},
			ann:   map[string]string{"other": "x"},
			want:  Signal{Action: ActionCheckpoint, Reason: "EarlyWarning(gcp)", Source: "gcp"},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Decide(tc.state, tc.ann, now)); diff != "" {
				t.Errorf("Decide() (-want +got):\n%s", diff)
			}
		})
	}
}

func taintedNode(keys ...string) *corev1.Node {
	n := &corev1.Node{}
	for _, k := range keys {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Effect: corev1.TaintEffectNoSchedule})
	}
	return n
}

func TestKubernetesNotice(t *testing.T) {
	evicted := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI"}}}}
	running := &corev1.Pod{}
	cordoned := taintedNode(corev1.TaintNodeUnschedulable)
	cordoned.Spec.Unschedulable = true
	shuttingDown := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Message: "container runtime status check may not have completed yet, node is shutting down"}}}}
	type result struct {
		Kind   notice.Kind
		Source string
	}
	testCases := map[string]struct {
		node *corev1.Node
		pods []*corev1.Pod
		want result
	}{
		"no node":                    {want: result{notice.None, ""}},
		"plain node":                 {node: taintedNode(), want: result{notice.None, ""}},
		"cluster-autoscaler":         {node: taintedNode("ToBeDeletedByClusterAutoscaler"), want: result{notice.Reclaim, "ToBeDeletedByClusterAutoscaler"}},
		"karpenter v1":               {node: taintedNode("karpenter.sh/disrupted"), want: result{notice.Reclaim, "karpenter.sh/disrupted"}},
		"karpenter v0.3x":            {node: taintedNode("karpenter.sh/disruption"), want: result{notice.Reclaim, "karpenter.sh/disruption"}},
		"nth spot interruption":      {node: taintedNode("aws-node-termination-handler/spot-itn"), want: result{notice.Reclaim, "aws-node-termination-handler/spot-itn"}},
		"nth scheduled maintenance":  {node: taintedNode("aws-node-termination-handler/scheduled-maintenance"), want: result{notice.Reclaim, "aws-node-termination-handler/scheduled-maintenance"}},
		"nth rebalance":              {node: taintedNode("aws-node-termination-handler/rebalance-recommendation"), want: result{notice.EarlyWarning, "aws-node-termination-handler/rebalance-recommendation"}},
		"our own taint is no signal": {node: taintedNode(TaintReclaiming), want: result{notice.None, ""}},
		"cordon alone":               {node: cordoned, pods: []*corev1.Pod{running}, want: result{notice.None, ""}},
		"cordon and drain":           {node: cordoned, pods: []*corev1.Pod{running, evicted}, want: result{notice.Reclaim, SourceUnschedulable}},
		"eviction without cordon":    {node: taintedNode(), pods: []*corev1.Pod{evicted}, want: result{notice.None, ""}},
		"graceful node shutdown":     {node: shuttingDown, want: result{notice.Reclaim, SourceNodeShutdown}},
		"reclaim wins over warning":  {node: taintedNode("aws-node-termination-handler/rebalance-recommendation", "karpenter.sh/disrupted"), want: result{notice.Reclaim, "karpenter.sh/disrupted"}},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			k, s := KubernetesNotice(tc.node, tc.pods)
			if diff := cmp.Diff(tc.want, result{k, s}); diff != "" {
				t.Errorf("KubernetesNotice() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDesiredMarks(t *testing.T) {
	reclaim := NodeState{Reclaim: notice.Notice{Kind: notice.Reclaim, Deadline: now, Source: "aws"}}
	marked := nodeMarks{deadline: "2026-11-29T12:00:00Z", source: "aws", tainted: true}
	warned := NodeState{Warning: notice.Notice{Kind: notice.EarlyWarning, Source: "gcp"}}
	testCases := map[string]struct {
		observed nodeMarks
		state    NodeState
		settled  bool
		want     nodeMarks
	}{
		"reclaim":                         {state: reclaim, settled: true, want: marked},
		"withdrawn":                       {observed: marked, settled: true, want: nodeMarks{}},
		"not settled keeps the old marks": {observed: marked, want: marked},
		"warning sets checkpoint time":    {state: warned, settled: true, want: nodeMarks{checkpoint: "2026-11-29T11:00:00Z"}},
		"warning keeps the first time":    {observed: nodeMarks{checkpoint: "2026-11-29T10:00:00Z"}, state: warned, settled: true, want: nodeMarks{checkpoint: "2026-11-29T10:00:00Z"}},
		"warning gone":                    {observed: nodeMarks{checkpoint: "2026-11-29T10:00:00Z"}, settled: true, want: nodeMarks{}},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got := desiredMarks(tc.observed, tc.state, tc.settled, now.Add(-time.Hour))
			tc.want.served = true // always: the node says an agent serves it (etjobv1.AnnotationNodeAgent)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(nodeMarks{})); diff != "" {
				t.Errorf("desiredMarks() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPodClaimMatches(t *testing.T) {
	user := func(name string, extra map[string]authnv1.ExtraValue) authnv1.UserInfo {
		return authnv1.UserInfo{Username: name, Extra: extra}
	}
	bound := map[string]authnv1.ExtraValue{ExtraPodName: {"w-0"}, ExtraPodUID: {"uid-1"}}
	testCases := map[string]struct {
		user    authnv1.UserInfo
		pod     string
		uid     string
		wantErr bool
	}{
		"bound to the pod":          {user: user("system:serviceaccount:ns:worker", bound), pod: "w-0", uid: "uid-1"},
		"pod not cached":            {user: user("system:serviceaccount:ns:worker", bound), pod: "w-0"},
		"another pod":               {user: user("system:serviceaccount:ns:worker", bound), pod: "w-1", wantErr: true},
		"an earlier pod, same name": {user: user("system:serviceaccount:ns:worker", bound), pod: "w-0", uid: "uid-2", wantErr: true},
		"another namespace":         {user: user("system:serviceaccount:other:worker", bound), pod: "w-0", wantErr: true},
		"not bound to a pod":        {user: user("system:serviceaccount:ns:worker", nil), pod: "w-0", wantErr: true},
		"not a service account":     {user: user("admin", bound), pod: "w-0", wantErr: true},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			err := podClaimMatches(tc.user, "ns", tc.pod, tc.uid)
			if (err != nil) != tc.wantErr {
				t.Errorf("podClaimMatches() = %v, want error %v", err, tc.wantErr)
			}
		})
	}
}

func TestWorkloadPods(t *testing.T) {
	ds := &corev1.Pod{}
	ds.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "etjob-agent"}}
	static := &corev1.Pod{}
	static.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"}
	done := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}
	worker := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	if got := workloadPods([]*corev1.Pod{ds, static, done}); got != 0 {
		t.Errorf("workloadPods(daemonset, static, finished) = %d, want 0 (drained)", got)
	}
	if got := workloadPods([]*corev1.Pod{ds, worker}); got != 1 {
		t.Errorf("workloadPods(daemonset, worker) = %d, want 1", got)
	}
}
