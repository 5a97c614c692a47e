package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/agent/notice"
)

// nodeMarks is what the agent keeps on its Node.
type nodeMarks struct {
	deadline, source, checkpoint string
	tainted                      bool
	// served: etjobv1.AnnotationNodeAgent, which tells the controller that
	// this node's notices come from its agent (pod-level notice Events
	// about its pods are then not trusted).
	served bool
}

func observedMarks(node *corev1.Node) nodeMarks {
	return nodeMarks{
		deadline:   node.Annotations[etjobv1.AnnotationNodeNotice],
		source:     node.Annotations[etjobv1.AnnotationNodeNoticeSource],
		checkpoint: node.Annotations[AnnotationCheckpointRequested],
		tainted:    hasTaint(node, TaintReclaiming),
		served:     node.Annotations[etjobv1.AnnotationNodeAgent] != "",
	}
}

// markedNotice is the reclamation notice an agent left on node (its deadline
// and source annotations), if any.
func markedNotice(node *corev1.Node) (notice.Notice, bool) {
	if node == nil {
		return notice.Notice{}, false
	}
	d, err := time.Parse(time.RFC3339, node.Annotations[etjobv1.AnnotationNodeNotice])
	if err != nil {
		return notice.Notice{}, false
	}
	src := node.Annotations[etjobv1.AnnotationNodeNoticeSource]
	return notice.Notice{Kind: notice.Reclaim, Deadline: d.UTC(), Source: src, Detail: "restored from the Node after a restart"}, true
}

// desiredMarks returns the markings for state st. Until the cloud source
// has settled, markings are only added, never removed: after a restart the
// agent does not yet know whether the notice it marked is still there.
func desiredMarks(observed nodeMarks, st NodeState, settled bool, warnSince time.Time) nodeMarks {
	want := nodeMarks{served: true}
	if st.Reclaim.Kind == notice.Reclaim {
		want.deadline = st.Reclaim.Deadline.UTC().Format(time.RFC3339)
		want.source = st.Reclaim.Source
		want.tainted = true
	}
	if st.Warning.Kind == notice.EarlyWarning {
		want.checkpoint = observed.checkpoint
		if want.checkpoint == "" {
			want.checkpoint = warnSince.UTC().Format(time.RFC3339)
		}
	}
	if !settled {
		if want.deadline == "" && observed.deadline != "" {
			want.deadline, want.source, want.tainted = observed.deadline, observed.source, observed.tainted
		}
		if want.checkpoint == "" {
			want.checkpoint = observed.checkpoint
		}
	}
	return want
}

// mark brings the Node's annotations and taint in line with st with a merge
// patch that carries the resourceVersion (the taint list is replaced whole,
// so a concurrent change must conflict and be retried on a fresh read), and
// records an Event for each change.
// cached is the informer's copy of the Node: when it already carries the
// right markings, no request is made (pod updates trigger syncs too).
func (a *Agent) mark(ctx context.Context, cached *corev1.Node, st NodeState, settled bool, warnSince time.Time) error {
	if m := observedMarks(cached); m == desiredMarks(m, st, settled, warnSince) {
		return nil
	}
	var before, after nodeMarks
	var ref *corev1.ObjectReference
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := a.o.Client.CoreV1().Nodes().Get(ctx, a.o.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ref = &corev1.ObjectReference{Kind: "Node", Name: node.Name, UID: node.UID, APIVersion: "v1"}
		before = observedMarks(node)
		after = desiredMarks(before, st, settled, warnSince)
		if before == after {
			return nil
		}
		patch, err := marksPatch(node, after)
		if err != nil {
			return err
		}
		_, err = a.o.Client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "etjob-agent"})
		return err
	})
	if err != nil {
		return fmt.Errorf("patching node %s: %w", a.o.NodeName, err)
	}
	switch {
	case after.deadline != "" && (after.deadline != before.deadline || after.source != before.source):
		a.recorder.Eventf(ref, corev1.EventTypeWarning, EventReasonReclaimNotice, "Reclamation notice from %s: the node goes at %s", after.source, after.deadline)
		a.log.Info("marked the node: reclamation notice", "source", after.source, "deadline", after.deadline)
	case after.deadline == "" && before.deadline != "":
		a.recorder.Eventf(ref, corev1.EventTypeNormal, EventReasonReclaimNoticeCancelled, "Reclamation notice from %s (deadline %s) was withdrawn", before.source, before.deadline)
		a.log.Info("unmarked the node: notice withdrawn", "source", before.source)
	}
	if after.checkpoint != "" && before.checkpoint == "" {
		a.recorder.Eventf(ref, corev1.EventTypeNormal, EventReasonEarlyWarning, "Early warning from %s: checkpoint requested", st.Warning.Source)
	}
	return nil
}

// marksPatch is the JSON merge patch from node to the markings m.
func marksPatch(node *corev1.Node, m nodeMarks) ([]byte, error) {
	val := func(s string) any {
		if s == "" {
			return nil // deletes the key
		}
		return s
	}
	ann := map[string]any{
		etjobv1.AnnotationNodeNotice:       val(m.deadline),
		etjobv1.AnnotationNodeNoticeSource: val(m.source),
		AnnotationCheckpointRequested:      val(m.checkpoint),
	}
	if m.served {
		ann[etjobv1.AnnotationNodeAgent] = "true"
	}
	patch := map[string]any{"metadata": map[string]any{"resourceVersion": node.ResourceVersion, "annotations": ann}}
	if m.tainted != hasTaint(node, TaintReclaiming) {
		taints := []corev1.Taint{}
		for _, t := range node.Spec.Taints {
			if t.Key != TaintReclaiming {
				taints = append(taints, t)
			}
		}
		if m.tainted {
			taints = append(taints, corev1.Taint{Key: TaintReclaiming, Effect: corev1.TaintEffectNoSchedule})
		}
		patch["spec"] = map[string]any{"taints": taints}
	}
	return json.Marshal(patch)
}
