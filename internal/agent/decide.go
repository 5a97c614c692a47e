package agent

import (
	"strconv"
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
	// ReclaimSince is when this agent first saw that notice.
	ReclaimSince time.Time
	// Warning is the early warning in force, Kind EarlyWarning, or Kind None.
	Warning notice.Notice
}

// Signal is the answer of GET /v1/signal.
type Signal = supervisor.Signal

// SourceController is the Signal source of a controller decision relayed
// from a pod annotation.
const SourceController = "controller"

// StopLeadWait bounds how long a pod that may train through its notice
// (etjob.dev/notice-lead-time) is told to checkpoint, not yet to leave,
// while the controller works out when it stops (etjob.dev/stop-lead). With
// the controller down, it then stops at the next step, as without lead time.
const StopLeadWait = 5 * time.Second

// Decide returns what a pod with the given annotations on a node in state s
// is told at now. A node notice comes first: it carries a hard deadline, and
// it works with the controller down. A pod the controller gave a stop lead
// trains on until that long before the deadline (StopAt; a deadline that
// moves moves it); one that may get a lead and has not yet checkpoints for up
// to StopLeadWait. Then the controller's leave annotation, then an early
// warning.
func Decide(s NodeState, podAnnotations map[string]string, now time.Time) Signal {
	if s.Reclaim.Kind == notice.Reclaim {
		sig := Signal{Action: ActionLeave, Reason: "ReclaimNotice(" + s.Reclaim.Source + ")",
			Deadline: s.Reclaim.Deadline.UTC().Format(time.RFC3339), Source: s.Reclaim.Source}
		if n, err := strconv.Atoi(podAnnotations[etjobv1.AnnotationStopLead]); err == nil && n > 0 {
			sig.StopAt = s.Reclaim.Deadline.Add(-time.Duration(n) * time.Second).UTC().Format(time.RFC3339)
			return sig
		}
		_, told := podAnnotations[etjobv1.AnnotationLeave]
		if podAnnotations[etjobv1.AnnotationNoticeLeadTime] == string(etjobv1.NoticeLeadTimeTrain) && !told &&
			now.Before(s.ReclaimSince.Add(StopLeadWait)) {
			sig.Action = ActionCheckpoint
		}
		return sig
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
