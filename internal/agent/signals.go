package agent

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/agent/notice"
)

// Node markings the agent owns (the API constants, re-exported here).
const (
	// AnnotationCheckpointRequested is etjobv1.AnnotationNodeCheckpointRequested.
	AnnotationCheckpointRequested = etjobv1.AnnotationNodeCheckpointRequested
	// TaintReclaiming is etjobv1.TaintReclaiming.
	TaintReclaiming = etjobv1.TaintReclaiming
	// EventReasonReclaimNotice is the Node event of a new reclamation notice.
	EventReasonReclaimNotice = "SpotReclaimNotice"
	// EventReasonReclaimNoticeCancelled is the Node event of a withdrawn notice.
	EventReasonReclaimNoticeCancelled = "SpotReclaimNoticeCancelled"
	// EventReasonEarlyWarning is the Node event of an early warning.
	EventReasonEarlyWarning = "SpotEarlyWarning"
)

// SourceUnschedulable and SourceNodeShutdown name Kubernetes-side notices
// that are not a taint of their own.
const (
	SourceUnschedulable = "node.kubernetes.io/unschedulable"
	SourceNodeShutdown  = "NodeShutdown"
)

// reclaimTaints are taints that other components put on a node that is
// going away: the node is treated as reclaimed within the Kubernetes notice
// window.
var reclaimTaints = append([]string{
	// AWS node termination handler, on a spot interruption, a scheduled
	// event, an ASG lifecycle termination.
	"aws-node-termination-handler/spot-itn",
	"aws-node-termination-handler/scheduled-maintenance",
	"aws-node-termination-handler/asg-lifecycle-termination",
	// Non-graceful node shutdown.
	"node.kubernetes.io/out-of-service",
	// cluster-autoscaler and Karpenter, before they drain and delete a node.
}, etjobv1.AutoscalerDrainTaints...)

// warningTaints are taints that announce a node may go soon.
var warningTaints = []string{
	"aws-node-termination-handler/rebalance-recommendation",
}

// KubernetesNotice reads the Kubernetes-side signals that node is going:
// a reclaim taint, a cordon with a drain under way (a pod on the node
// evicted through the Eviction API), or the kubelet shutting the node down.
// It returns the notice kind and its source (the taint key or condition).
// The agent's own taint is not a signal.
func KubernetesNotice(node *corev1.Node, pods []*corev1.Pod) (notice.Kind, string) {
	if node == nil {
		return notice.None, ""
	}
	for _, key := range reclaimTaints {
		if hasTaint(node, key) {
			return notice.Reclaim, key
		}
	}
	for _, c := range node.Status.Conditions {
		// The kubelet's graceful node shutdown reports it in the Ready
		// condition ("node is shutting down").
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue && strings.Contains(c.Message, "node is shutting down") {
			return notice.Reclaim, SourceNodeShutdown
		}
	}
	if node.Spec.Unschedulable && draining(pods) {
		return notice.Reclaim, SourceUnschedulable
	}
	for _, key := range warningTaints {
		if hasTaint(node, key) {
			return notice.EarlyWarning, key
		}
	}
	return notice.None, ""
}

// draining reports whether a pod was evicted through the Eviction API (what
// kubectl drain and node termination handlers use): a cordon alone is not a
// notice with a deadline here. The controller takes a cordon itself for a
// notice without one (core.DrainSource), and each job's disruption budget
// holds the eviction until its pod left, so on a cluster running etjob this
// mostly serves pods of other controllers' kinds.
func draining(pods []*corev1.Pod) bool {
	for _, p := range pods {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == "EvictionByEvictionAPI" {
				return true
			}
		}
	}
	return false
}

func hasTaint(node *corev1.Node, key string) bool {
	for _, t := range node.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}
