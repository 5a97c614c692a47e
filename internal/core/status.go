package core

import (
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// conditions sets Running, Suspended (WaitingForCapacity) and Resizing from
// the membership this pass publishes.
func (d *decision) conditions() {
	n, lo, hi := len(d.members), int(d.spec.MinReplicas), int(d.spec.MaxReplicas)
	switch {
	case d.restarting:
		// A restart, not a fall below min: the Running condition says so
		// until the next attempt's pods run (what etjob get's STATUS reads).
		d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonRestarting,
			"restarting: the last attempt's pods are going; the next attempt starts once they are gone")
	case n >= lo && n <= hi:
		d.setCondition(etjobv1.ConditionRunning, true, etjobv1.ReasonMembersReady,
			fmt.Sprintf("%d members (min %d, max %d), generation %d", n, lo, hi, d.membership.Generation))
		d.setCondition(etjobv1.ConditionSuspended, false, etjobv1.ReasonNotSuspended, "")
	default:
		why := d.waitingMessage()
		d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonWaitingForCapacity, why)
		suspended := meta.IsStatusConditionTrue(d.conds, etjobv1.ConditionSuspended)
		if d.wasRunning || suspended {
			if !suspended {
				d.record(etjobv1.TimelineSuspend, "below spec.minReplicas: waiting for capacity")
				d.event(true, etjobv1.EventWaitingForCapacity, why)
			}
			d.setCondition(etjobv1.ConditionSuspended, true, etjobv1.ReasonWaitingForCapacity, why)
		}
	}
	if n >= lo && meta.IsStatusConditionTrue(d.s.Job.Status.Conditions, etjobv1.ConditionSuspended) &&
		meta.FindStatusCondition(d.s.Job.Status.Conditions, etjobv1.ConditionSuspended).Reason == etjobv1.ReasonWaitingForCapacity {
		d.record(etjobv1.TimelineResume, "capacity returned: resuming from the last checkpoint")
		d.event(false, etjobv1.EventResumed, "capacity returned: resuming from the last checkpoint")
	}
	active, leaving := d.counts()
	desired := int(d.desired())
	switch {
	case leaving > 0:
		d.setCondition(etjobv1.ConditionResizing, true, etjobv1.ReasonWorkersLeaving, fmt.Sprintf("%d workers leaving", leaving))
	case active < desired && d.budgetShort > 0:
		d.setCondition(etjobv1.ConditionResizing, true, etjobv1.ReasonOverBudget, d.budgetMessage(active, desired))
	case active < desired || n < active:
		d.setCondition(etjobv1.ConditionResizing, true, etjobv1.ReasonScalingUp, fmt.Sprintf("%d of %d workers are members", n, desired))
	case active > desired:
		d.setCondition(etjobv1.ConditionResizing, true, etjobv1.ReasonScalingDown, fmt.Sprintf("%d workers, %d desired", active, desired))
	default:
		d.setCondition(etjobv1.ConditionResizing, false, etjobv1.ReasonStable, "")
	}
}

// waitingMessage says why the job is below min, with the scheduler's words
// when a worker is unschedulable.
func (d *decision) waitingMessage() string {
	pending, unsched := 0, ""
	for _, w := range d.workers {
		if !w.active() || d.deleted[w.pod.Name] || w.scheduled {
			continue
		}
		pending++
		for _, c := range w.pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && unsched == "" {
				unsched = c.Message
			}
		}
	}
	pending += len(d.created)
	msg := fmt.Sprintf("waiting for capacity: %d of spec.minReplicas (%d) workers ready, %d pending",
		len(d.members), d.spec.MinReplicas, pending)
	if unsched != "" {
		msg += ": " + unsched
	}
	if d.budgetShort > 0 {
		msg += "; " + d.budgetMessage(len(d.members)+pending, int(d.desired()))
	}
	return msg
}

// budgetMessage says that spec.spot.budgetPerHour holds the job below its
// desired size.
func (d *decision) budgetMessage(active, desired int) string {
	return fmt.Sprintf("%d of %d workers: spec.spot.budgetPerHour %s leaves %s an hour for new ones", active, desired,
		d.spec.Spot.BudgetPerHour, max(d.budgetLeft, 0))
}

// counts returns the workers that stay (with the ones created this pass) and
// the ones leaving.
func (d *decision) counts() (active, leaving int) {
	for _, w := range d.workers {
		if d.deleted[w.pod.Name] || w.deleting || w.terminal {
			continue
		}
		if w.active() && !d.signaled[w.pod.Name] {
			active++
		} else {
			leaving++
		}
	}
	return active + len(d.created), leaving
}

// workerStatuses is status.workers, and the replicas, ready and leaving
// counts, for the membership m that the status carries: every worker not
// deleted this pass, and the ones created.
func (d *decision) workerStatuses(m etjobv1.MembershipStatus) (list []etjobv1.WorkerStatus, replicas, ready, leaving int32) {
	memberSet := map[string]bool{}
	for _, h := range m.Hosts {
		memberSet[HostName(h)] = true
	}
	for _, w := range d.workers {
		if d.deleted[w.pod.Name] {
			continue
		}
		ws := etjobv1.WorkerStatus{Name: w.pod.Name, Index: w.index, Node: w.pod.Spec.NodeName}
		switch {
		case w.succeeded:
			ws.State = etjobv1.WorkerSucceeded
		case w.terminal && w.preempted:
			ws.State, ws.Reason = etjobv1.WorkerPreempted, w.preemptReason
		case w.terminal:
			ws.State, ws.Reason = etjobv1.WorkerFailed, "exit code "+strconv.Itoa(int(w.exitCode))
		case w.leaving() || d.signaled[w.pod.Name] || w.deleting:
			ws.State, ws.Reason = etjobv1.WorkerLeaving, w.leaveReason
			if w.noticed {
				ws.Reason = w.noticeReason
			}
			leaving++
		case memberSet[w.pod.Name]:
			ws.State = etjobv1.WorkerMember
		case d.joining[w.pod.Name]:
			// Held for its scale-out's batch: reported as it was, so the
			// hold costs no status write of its own.
			ws.State, ws.Node = etjobv1.WorkerPending, ""
		case w.ready:
			ws.State = etjobv1.WorkerReady
		case w.pod.Status.Phase == corev1.PodRunning:
			ws.State = etjobv1.WorkerStarting
		default:
			// A bind alone is not worth a status write (issue #6: at most
			// 2k+3 API writes per scale event of k pods); the node shows
			// from the worker's next state on.
			ws.State, ws.Node = etjobv1.WorkerPending, ""
		}
		ws.Reason = clipReason(ws.Reason)
		if ws.State == etjobv1.WorkerMember || ws.State == etjobv1.WorkerReady || ws.State == etjobv1.WorkerStarting || ws.State == etjobv1.WorkerPending {
			replicas++
			if w.ready && !d.joining[w.pod.Name] {
				ready++
			}
		}
		list = append(list, ws)
	}
	for _, i := range d.created {
		list = append(list, etjobv1.WorkerStatus{Name: WorkerName(d.job.Name, i), Index: i, State: etjobv1.WorkerPending})
		replicas++
	}
	return list, replicas, ready, leaving
}

// stampTimeline appends this pass's timeline entries to the status's,
// stamped with the membership's generation and size, keeping the last
// TimelineLimit.
func (d *decision) stampTimeline(tl []etjobv1.TimelineEvent, generation int64, members int32) []etjobv1.TimelineEvent {
	for _, e := range d.timeline {
		e.Generation = generation
		e.Members = members
		tl = append(tl, e)
	}
	if over := len(tl) - TimelineLimit; over > 0 {
		tl = slices.Clone(tl[over:])
	}
	return tl
}

// lastCheckpoint publishes the newest checkpoint the workers reported, and
// says so when writing it takes longer than the notice window of a cloud the
// members run on (the job would lose work on a reclamation there).
func (d *decision) lastCheckpoint() {
	var best *etjobv1.CheckpointAnnotation
	for _, v := range d.all() {
		if c := v.checkpoint; c != nil && (best == nil || c.Step > best.Step || (c.Step == best.Step && c.Time > best.Time)) {
			best = c
		}
	}
	if best != nil && (d.checkpoint == nil || best.Step >= d.checkpoint.Step) {
		cp := &etjobv1.CheckpointStatus{Step: best.Step, Path: best.Path, DurationMilliseconds: int64(best.Seconds * 1000)}
		if t, err := time.Parse(time.RFC3339, best.Time); err == nil {
			cp.Time = &metav1.Time{Time: t}
		}
		d.checkpoint = cp
	}
	if d.finished() || d.checkpoint == nil || d.checkpoint.DurationMilliseconds <= 0 {
		return
	}
	took := time.Duration(d.checkpoint.DurationMilliseconds) * time.Millisecond
	slow := ""
	for _, w := range d.members {
		if n, ok := NoticeWindows[w.provider]; ok && took > n.Usable {
			slow = fmt.Sprintf("the last checkpoint took %s, longer than the ~%s a %s reclamation notice leaves (worker %s): a noticed loss there would lose the steps since the previous checkpoint",
				took.Round(100*time.Millisecond), n.Usable, w.provider, w.pod.Name)
			break
		}
	}
	was := meta.IsStatusConditionTrue(d.conds, etjobv1.ConditionCheckpointTooSlow)
	switch {
	case slow != "":
		if !was {
			d.event(true, etjobv1.EventCheckpointTooSlow, slow)
		}
		d.setCondition(etjobv1.ConditionCheckpointTooSlow, true, etjobv1.ConditionCheckpointTooSlow, slow)
	case was:
		d.setCondition(etjobv1.ConditionCheckpointTooSlow, false, "CheckpointInTime", "")
	}
}

// summary is the human-facing status column: the outcome, a suspension's
// reason, or what the job is doing.
func (d *decision) summary() string {
	c := d.conds
	switch {
	case meta.IsStatusConditionTrue(c, etjobv1.ConditionComplete):
		return "Succeeded"
	case meta.IsStatusConditionTrue(c, etjobv1.ConditionFailed):
		return "Failed"
	case meta.IsStatusConditionTrue(c, etjobv1.ConditionSuspended):
		return meta.FindStatusCondition(c, etjobv1.ConditionSuspended).Reason
	}
	if r := meta.FindStatusCondition(c, etjobv1.ConditionRunning); r != nil && (r.Reason == etjobv1.ReasonRestarting || r.Reason == etjobv1.ReasonCompleting || r.Reason == etjobv1.ReasonLauncherMoving) {
		return r.Reason
	}
	if d.restarting {
		return "Restarting"
	}
	if !meta.IsStatusConditionTrue(c, etjobv1.ConditionRunning) {
		return "Pending"
	}
	if meta.IsStatusConditionTrue(c, etjobv1.ConditionResizing) {
		return "Resizing"
	}
	return "Running"
}

// clipReason cuts a worker's reason to etjobv1.MaxReasonLength characters:
// the status lists every worker, and must fit within etcd's object limit at
// etjobv1.MaxWorkers workers.
func clipReason(r string) string {
	if utf8.RuneCountInString(r) <= etjobv1.MaxReasonLength {
		return r
	}
	return string([]rune(r)[:etjobv1.MaxReasonLength-3]) + "..."
}
