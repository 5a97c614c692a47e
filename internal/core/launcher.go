package core

import (
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// launcherAction is what the launcher rule (judgeLauncher) decides in a pass.
type launcherAction int

const (
	// launcherRuns: nothing to do for the launcher.
	launcherRuns launcherAction = iota
	// launcherCreate: it is missing; create it (horovodrun waits for its
	// workers: startHorovodLauncher).
	launcherCreate
	// launcherAwaitName: it is being deleted; a restart waits for its name.
	launcherAwaitName
	// launcherStoreGone: a torchrun job lost its rendezvous store while it had
	// members: restart from the checkpoint.
	launcherStoreGone
	// launcherCompleted: horovodrun exited 0, the job is complete.
	launcherCompleted
	// launcherReplace: spec.recovery InProcess, noticed, lost or failed: it
	// is replaced alone, the workers train on.
	launcherReplace
	// launcherMove: noticed: the workers checkpoint, then the job restarts.
	launcherMove
	// launcherRelease: a horovodrun that etjob stopped, or whose ranks all
	// left or were lost, goes as neither a failure nor a preemption.
	launcherRelease
	// launcherLost: lost, failed or on a node NotReady too long: counted,
	// then the job restarts or fails.
	launcherLost
)

// launcherFacts are what the launcher rule reads besides the spec and the
// time, gathered by the pass (launcherFacts): its pod (nil when missing),
// whether the pass restarts, the published members, whether the last pass
// was moving it, and the Horovod rules' answers about its exit.
type launcherFacts struct {
	launcher   *podView
	restarting bool
	members    int
	// stoppedReleased: releaseStoppedLauncher; exitReleased:
	// horovodExitReleased (read only for a terminal horovodrun).
	stoppedReleased, exitReleased bool
}

// launcherVerdict is the launcher rule's outcome: the action, why the
// store is gone (launcherStoreGone), whether a created launcher replaces
// one under members (status.launcherReplacements), whether a replaced one
// was noticed rather than lost, and when to look again at a launcher on a
// NotReady node (zero: no such wait).
type launcherVerdict struct {
	action      launcherAction
	storeGone   string
	replacement bool
	noticed     bool
	lookAgainAt time.Time
}

// judgeLauncher is the launcher rule as a function: a missing launcher is
// created, a finished, lost or noticed one dealt with according to the
// framework and spec.recovery.
func judgeLauncher(spec *etjobv1.ElasticJobSpec, now time.Time, f launcherFacts) launcherVerdict {
	l := f.launcher
	if why := storeGone(spec, f); why != "" {
		return launcherVerdict{action: launcherStoreGone, storeGone: why}
	}
	if l == nil {
		if f.restarting || spec.Framework == etjobv1.FrameworkHorovod {
			return launcherVerdict{action: launcherRuns}
		}
		// members train: under InProcess this launcher replaces one (replaceLauncher)
		return launcherVerdict{action: launcherCreate, replacement: spec.Recovery == etjobv1.RecoveryInProcess && f.members > 0}
	}
	if l.deleting {
		if spec.Recovery != etjobv1.RecoveryInProcess {
			return launcherVerdict{action: launcherAwaitName}
		}
		return launcherVerdict{action: launcherRuns}
	}
	if l.terminal && l.succeeded && spec.Framework == etjobv1.FrameworkHorovod {
		return launcherVerdict{action: launcherCompleted}
	}
	noticed := l.noticed && !l.terminal && !l.lost
	if spec.Recovery == etjobv1.RecoveryInProcess {
		if noticed || l.terminal || l.lost {
			return launcherVerdict{action: launcherReplace, noticed: noticed}
		}
		if expired, at := notReadyTooLong(spec, now, l); !expired {
			return launcherVerdict{action: launcherRuns, lookAgainAt: at}
		}
		return launcherVerdict{action: launcherReplace}
	}
	if noticed {
		return launcherVerdict{action: launcherMove}
	}
	if f.stoppedReleased {
		return launcherVerdict{action: launcherRelease}
	}
	if !l.terminal && !l.lost {
		if expired, at := notReadyTooLong(spec, now, l); !expired {
			return launcherVerdict{action: launcherRuns, lookAgainAt: at}
		}
	}
	if l.terminal && spec.Framework == etjobv1.FrameworkHorovod && f.exitReleased {
		return launcherVerdict{action: launcherRelease}
	}
	return launcherVerdict{action: launcherLost}
}

// launcherFacts gathers what judgeLauncher reads.
func (d *decision) launcherFacts() launcherFacts {
	f := launcherFacts{launcher: d.launcher, restarting: d.restarting, members: len(d.s.Job.Status.Membership.Hosts)}
	if l := d.launcher; l != nil && !l.deleting {
		f.stoppedReleased = d.releaseStoppedLauncher()
		f.exitReleased = l.terminal && d.spec.Framework == etjobv1.FrameworkHorovod && d.horovodExitReleased(l)
	}
	return f
}

// handleLauncher applies judgeLauncher. It reports ended when the job
// restarted, completed or failed, hold while the launcher moves
// (moveLauncher).
func (d *decision) handleLauncher() outcome {
	v := judgeLauncher(d.spec, d.now, d.launcherFacts())
	if !v.lookAgainAt.IsZero() {
		d.requeueAt(v.lookAgainAt)
	}
	l := d.launcher
	switch v.action {
	case launcherCreate:
		d.createLauncher = true
		d.launcherReplaced = v.replacement
	case launcherAwaitName:
		d.restarting = true // wait for the name to be free
	case launcherStoreGone:
		d.restart(v.storeGone + ": the rendezvous store is lost; restarting from the last checkpoint with a new launcher")
		return ended
	case launcherCompleted:
		d.complete("launcher exited 0")
		return ended
	case launcherReplace:
		return d.replaceLauncher(l, v.noticed)
	case launcherMove:
		return d.moveLauncher(l)
	case launcherRelease:
		return d.releaseLauncher(l)
	case launcherLost:
		return d.launcherLost(l)
	}
	return proceed
}

// launcherLost deletes a launcher that is lost, failed or on a node
// NotReady too long, counts it, and restarts or fails the job. It reports
// ended.
func (d *decision) launcherLost(l *podView) outcome {
	reason, preempted := launcherLoss(l)
	d.delete(l, reason)
	// Losing the launcher with its node (the rendezvous store, horovodrun) is
	// not the training's fault: a preemption, never a failure. Only its own
	// exit code counts against backoffLimit (and not when its node was
	// noticed, or the last pass was moving it: its node went first).
	if preempted {
		d.countPreemption(l)
	} else if !l.noticed && !d.launcherMoving() {
		d.countFailure(l)
	}
	msg := fmt.Sprintf("launcher %s lost (%s)", l.pod.Name, reason)
	switch {
	case d.launcherFailed(l, preempted, msg):
	case preempted || d.spec.RestartPolicy == etjobv1.RestartPolicyOnFailure:
		d.restart(msg)
	default:
		d.fail(etjobv1.ReasonLauncherFailed, msg+"; spec.restartPolicy is Never")
	}
	return ended
}

// storeGone says why a torchrun job under spec.recovery Restart lost its
// rendezvous store while it had members, or "": its launcher's pod was
// deleted by someone else than etjob (a user, or the pod garbage collector
// once its node object went: no grace period, no notice), or is gone
// altogether. The workers' torchrun agents cannot go on without their store
// (a new launcher's store is empty), so the job restarts at once from its
// checkpoint, before the workers fail on their own: like a lost node, not a
// failure. etjob's own deletions of a launcher restart the job in the same
// pass (its members are then gone) or come from a spec.recovery InProcess
// job (replaceLauncher), and horovod jobs have no launcher before their
// members (startHorovodLauncher).
func storeGone(spec *etjobv1.ElasticJobSpec, f launcherFacts) string {
	if f.restarting || spec.Recovery == etjobv1.RecoveryInProcess || spec.Framework == etjobv1.FrameworkHorovod || f.members == 0 {
		return ""
	}
	switch l := f.launcher; {
	case l == nil:
		return fmt.Sprintf("the launcher is gone while %d workers were members (its pod deleted, or removed with its node)", f.members)
	case l.deleting:
		return fmt.Sprintf("launcher %s deleted while %d workers were members", l.pod.Name, f.members)
	}
	return ""
}

// launcherLoss says why a launcher that is terminal, lost or on a node
// NotReady too long is gone, and whether its capacity was taken (a
// preemption) rather than it failing on its own (its exit code, and the
// lines of its log that say why).
func launcherLoss(l *podView) (reason string, preempted bool) {
	switch {
	case l.lost:
		return l.lostReason, true
	case !l.terminal:
		return "NodeNotReady", true
	case l.preempted:
		return l.preemptReason, true
	}
	reason = "exit code " + strconv.Itoa(int(l.exitCode))
	if why := logSummary(l.message); why != "" {
		reason += ": " + why
	}
	return reason, false
}

// launcherFailed fails the job, and reports true, when a launcher that
// failed on its own (not preempted) cannot run its command (exit 126 or
// 127, the shell's "not executable" and "not found": the image lacks it,
// and no retry can help), or when its failure went past backoffLimit.
func (d *decision) launcherFailed(l *podView, preempted bool, msg string) bool {
	switch {
	case !preempted && (l.exitCode == 126 || l.exitCode == 127):
		d.fail(etjobv1.ReasonLauncherFailed, fmt.Sprintf("launcher %s could not run its command (exit code %d: the image does not have it, or it is not executable): %s",
			l.pod.Name, l.exitCode, logSummary(l.message)))
	case d.failures > BackoffLimit(d.spec):
		d.fail(etjobv1.ReasonBackoffLimit, msg+fmt.Sprintf("; %d failures exceed spec.backoffLimit (%d)", d.failures, BackoffLimit(d.spec)))
	default:
		return false
	}
	return true
}

// moveLauncher handles a reclamation notice on the launcher's node. The
// launcher hosts the torchrun rendezvous store (or horovodrun), which cannot
// move under running workers: every worker is told to checkpoint at the step
// all ranks agree on and stop; once they have (or their grace period is over)
// the job restarts from that checkpoint with a new launcher, which the
// scheduler places off the tainted node. Neither the move nor the workers'
// exits count as failures. It reports hold while workers still checkpoint
// (the pass then publishes the membership without them), ended once the job
// restarted.
func (d *decision) moveLauncher(l *podView) outcome {
	tell, until := launcherMoveSignals(d.workers, d.now, LeaveGrace(d.spec), l.noticeDeadline)
	for _, w := range tell {
		w.leaveAt = d.now
		d.signal(w, etjobv1.ReasonLauncherMoving)
	}
	told, waiting := len(tell), !until.IsZero()
	if waiting {
		d.requeueAt(until)
	}
	msg := fmt.Sprintf("the node of launcher %s is being reclaimed (%s)", l.pod.Name, l.noticeReason)
	if waiting {
		if told > 0 {
			d.record(etjobv1.TimelineMove, fmt.Sprintf("%s: %d workers told to checkpoint and stop", msg, told))
			d.event(false, etjobv1.EventLauncherMoving, msg+": the workers checkpoint and stop, then the job restarts on other capacity")
		}
		d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonLauncherMoving, msg)
		d.setCondition(etjobv1.ConditionResizing, true, etjobv1.ReasonLauncherMoving, msg)
		return hold
	}
	d.delete(l, l.noticeReason)
	d.countPreemption(l)
	d.restart(msg + ": restarting from the last checkpoint with a new launcher")
	return ended
}

// launcherMoveSignals is the move's rule as a function: the ready workers
// not yet told to stop are told now, and the move waits while a running
// worker's stop is not yet due (its grace period from when it was told, or
// the launcher node's notice deadline when that is later): until is the
// earliest such time not yet passed, when the pass looks again, zero when
// none is left to wait for.
func launcherMoveSignals(workers []*podView, now time.Time, grace time.Duration, notice time.Time) (tell []*podView, until time.Time) {
	for _, w := range workers {
		if w.deleting || w.terminal || w.lost {
			continue
		}
		leaveAt := w.leaveAt
		if leaveAt.IsZero() {
			if !w.ready {
				continue // not training: nothing to save
			}
			leaveAt = now
			tell = append(tell, w)
		}
		if at := leaveDeadline(grace, leaveAt, notice); now.Before(at) && (until.IsZero() || at.Before(until)) {
			until = at
		}
	}
	return tell, until
}

// replaceLauncher replaces the launcher of a spec.recovery InProcess job
// alone: its workers (etjob.elastic) keep their processes and their state,
// train on while the rendezvous store is away and reconnect to the new one.
// A noticed launcher is replaced at once (nothing to save: the workers hold
// the state), a lost or preempted one is a preemption, and only a launcher
// that exited non-zero on its own counts as a failure. A launcher created
// while the job has members counts in status.launcherReplacements, which
// the launcher gets as ETJOB_RDZV_REPLACEMENT: its store then tells the
// workers that it is not the attempt's first, so that no newcomer opens a
// generation in it before the members have told it theirs (the count is
// taken at the creation, from the planned status the pod is rendered
// from, so that a status write lost in between cannot leave a replacement
// unmarked). It reports ended when the
// job failed, else proceed: the workers' pass goes on (the new launcher is
// created once the old one's name is free).
func (d *decision) replaceLauncher(l *podView, noticed bool) outcome {
	reason, preempted := l.noticeReason, true
	msg := fmt.Sprintf("the node of launcher %s is being reclaimed (%s)", l.pod.Name, reason)
	if !noticed {
		reason, preempted = launcherLoss(l)
		msg = fmt.Sprintf("launcher %s lost (%s)", l.pod.Name, reason)
	}
	d.delete(l, reason)
	if preempted {
		d.countPreemption(l)
	} else {
		d.countFailure(l)
		if d.launcherFailed(l, false, msg) {
			return ended
		}
	}
	msg += "; replacing the launcher alone: spec.recovery is InProcess, the workers train on and reconnect to the new one's rendezvous store"
	d.record(etjobv1.TimelineMove, msg)
	d.event(!preempted, etjobv1.EventLauncherReplaced, msg)
	return proceed
}

// launcherMoving reports whether the last pass was moving the launcher: its
// node may be gone by now, and the notice with it.
func (d *decision) launcherMoving() bool {
	c := meta.FindStatusCondition(d.s.Job.Status.Conditions, etjobv1.ConditionRunning)
	return c != nil && c.Reason == etjobv1.ReasonLauncherMoving
}

// releaseLauncher deletes a horovod launcher that etjob stopped (below
// minReplicas, or for joiners no rank of it could hand the state to) or
// whose ranks all left or were lost, counting it as neither a failure nor a
// preemption (horovodExitReleased, releaseStoppedLauncher). horovodrun
// cannot wait below its minimum (a new one waits for -np slots and, without
// --network-interface, two hosts) nor take a host set with none of its own,
// so the job goes on as a restart: a new launcher once enough workers are
// ready again, resuming from the checkpoint of the agreed stop. It reports
// ended: nothing else runs this pass.
func (d *decision) releaseLauncher(l *podView) outcome {
	d.delete(l, etjobv1.ReasonWaitingForCapacity)
	how := "exit code " + strconv.Itoa(int(l.exitCode))
	if !l.terminal {
		how = "no rank of it left"
	}
	msg := fmt.Sprintf("launcher %s ended after its ranks stopped (%s); a new one starts when %d workers are ready",
		l.pod.Name, how, d.spec.MinReplicas)
	d.restart(msg)
	d.setCondition(etjobv1.ConditionSuspended, true, etjobv1.ReasonWaitingForCapacity, msg)
	return ended
}

// horovodStopped reports whether etjob stopped this horovod job's training:
// it fell below minReplicas and its workers were told to checkpoint and stop.
// horovodrun then exits non-zero (every rank left), and that exit is etjob's
// doing, not a failure.
func (d *decision) horovodStopped() bool {
	c := meta.FindStatusCondition(d.s.Job.Status.Conditions, etjobv1.ConditionSuspended)
	return d.spec.Framework == etjobv1.FrameworkHorovod && c != nil && c.Status == metav1.ConditionTrue &&
		c.Reason == etjobv1.ReasonWaitingForCapacity
}

// startHorovodLauncher asks for the launcher of a horovod job once at least
// minReplicas workers are published members and no joiner is held back: the
// launcher's `workers` (-np in Arena's command line) is then the number of
// members, which horovodrun finds at once, instead of spec.replicas, which it
// would wait for up to its --elastic-timeout (600 s) when capacity is short.
func (d *decision) startHorovodLauncher() {
	if d.spec.Framework != etjobv1.FrameworkHorovod || d.launcher != nil || d.restarting {
		return
	}
	if len(d.members) < max(int(d.spec.MinReplicas), 1) || len(d.joining) > 0 {
		return
	}
	// Workers that are bound and still starting get JoinBatchWindow from the
	// first member's readiness, so that a job whose workers start together
	// starts horovodrun with all of them instead of resetting it at once.
	first := time.Time{}
	for _, w := range d.members {
		if !w.readySince.IsZero() && (first.IsZero() || w.readySince.Before(first)) {
			first = w.readySince
		}
	}
	for _, w := range d.workers {
		if w.active() && w.scheduled && !w.ready && !d.deleted[w.pod.Name] && !first.IsZero() && d.now.Before(first.Add(JoinBatchWindow)) {
			d.requeueAt(first.Add(JoinBatchWindow))
			return
		}
	}
	d.createLauncher = true
}

// invalidPodTemplate says why the job fails at once when the API server
// refused to create one of its pods as invalid (the controller reports that
// as CreateRefused with reason PodTemplateInvalid): every other pod from the
// same templates would be refused the same way, for ever. "" otherwise: a
// quota or an admission refusal may pass later, and the job waits.
func (d *decision) invalidPodTemplate() string {
	c := meta.FindStatusCondition(d.conds, etjobv1.ConditionCreateRefused)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != etjobv1.ReasonPodTemplateInvalid {
		return ""
	}
	return "the API server refuses the job's pods as invalid (no retry can mend it; fix the pod template): " + c.Message
}

// invalidHorovodLauncher says why a horovod job's launcher cannot work, or
// "": its container must run horovodrun (spec.framework horovod means the
// launcher runs it and the workers wait for its ranks), else the workers
// would idle for ever while the launcher trains alone, or does nothing.
func (d *decision) invalidHorovodLauncher() string {
	if d.spec.Framework != etjobv1.FrameworkHorovod || d.spec.LauncherTemplate == nil {
		return ""
	}
	runs := false
	for _, c := range d.spec.LauncherTemplate.Spec.Containers {
		line := strings.Join(append(append([]string{}, c.Command...), c.Args...), " ")
		if !strings.Contains(line, "horovodrun") {
			continue
		}
		runs = true
		// etjob's scripts are the only files in /etc/edl and /etc/mpi (its
		// ConfigMap, mounted read-only): any other name there cannot exist,
		// and horovodrun would only say so in a traceback.
		if m := discoveryScriptFlag.FindStringSubmatch(line); m != nil {
			script := strings.Trim(m[1], `"'`)
			if (strings.HasPrefix(script, "/etc/edl/") || strings.HasPrefix(script, "/etc/mpi/")) && path.Base(script) != "discover_hosts.sh" {
				return fmt.Sprintf("spec.launcherTemplate: --host-discovery-script %s does not exist: etjob provides /etc/edl/discover_hosts.sh", script)
			}
		}
	}
	if runs {
		return ""
	}
	return "spec.launcherTemplate: a horovod job's launcher must run horovodrun (its command or args name none); " +
		"put `horovodrun ... --host-discovery-script /etc/edl/discover_hosts.sh python train.py` there, or use spec.framework torchrun"
}

// discoveryScriptFlag finds horovodrun's --host-discovery-script argument.
var discoveryScriptFlag = regexp.MustCompile(`--host-discovery-script[= ]+(\S+)`)
