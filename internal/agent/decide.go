package agent

import (
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/agent/notice"
	"github.com/etjob/etjob/pkg/supervisor"
)

// Actions a pod is told on /v1/signal (the wire contract lives in
// pkg/supervisor, which Go workers import).
const (
	ActionNone       = supervisor.ActionNone
	ActionCheckpoint = supervisor.ActionCheckpoint
	ActionLeave      = supervisor.ActionLeave
)

// NodeState is what the agent knows about its node: the reclamation notice
// and the early warning in force (Kind None when there is none), from the
// cloud or from Kubernetes.
type NodeState struct {
	// Reclaim is the notice in force, Kind Reclaim, or Kind None.
	Reclaim notice.Notice
	// Warning is the early warning in force, Kind EarlyWarning, or Kind None.
	Warning notice.Notice
}

// Signal is the answer of GET /v1/signal.
type Signal = supervisor.Signal

// SourceController is the Signal source of a controller decision relayed
// from a pod annotation.
const SourceController = "controller"

// Decide returns what a pod with the given annotations on a node in state s
// is told. A node notice comes first: it carries a hard deadline, and it
// works with the controller down. Then the controller's leave annotation,
// then an early warning.
func Decide(s NodeState, podAnnotations map[string]string) Signal {
	if s.Reclaim.Kind == notice.Reclaim {
		return Signal{Action: ActionLeave, Reason: "ReclaimNotice(" + s.Reclaim.Source + ")",
			Deadline: s.Reclaim.Deadline.UTC().Format(time.RFC3339), Source: s.Reclaim.Source}
	}
	if _, ok := podAnnotations[etjobv1.AnnotationLeave]; ok {
		reason := podAnnotations[etjobv1.AnnotationLeaveReason]
		if reason == "" {
			reason = "Leave"
		}
		return Signal{Action: ActionLeave, Reason: reason, Source: SourceController}
	}
	if s.Warning.Kind == notice.EarlyWarning {
		return Signal{Action: ActionCheckpoint, Reason: "EarlyWarning(" + s.Warning.Source + ")", Source: s.Warning.Source}
	}
	return Signal{Action: ActionNone}
}
