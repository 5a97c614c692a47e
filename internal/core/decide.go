package core

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Decide returns what should be done for one ElasticJob, given what was
// observed and the current time. It is pure: the same snapshot and time always
// give the same plan.
func Decide(s Snapshot, now time.Time) Plan {
	d := newDecision(s, now)
	invalid := d.invalidHorovodLauncher()
	switch {
	case d.finished():
		d.finish()
	case invalid != "":
		d.fail(etjobv1.ReasonInvalidLauncher, invalid)
	case d.job.Spec.Suspend != nil && *d.job.Spec.Suspend:
		d.suspend()
	default:
		d.run()
	}
	d.summarize()
	return d.plan
}

type decision struct {
	s    Snapshot
	now  time.Time
	job  *etjobv1.ElasticJob
	spec *etjobv1.ElasticJobSpec
	st   etjobv1.ElasticJobStatus
	plan Plan

	workers  []*podView // current attempt, by index
	launcher *podView   // current attempt
	stale    []*podView // older attempts
	deleted  map[string]bool
	signaled map[string]bool
	created  []int32
	timeline []etjobv1.TimelineEvent
	// wasRunning: the Running condition was true before this pass.
	wasRunning bool
	members    []*podView
	restarting bool
	// joining are ready workers held back by batchJoiners this pass.
	joining map[string]bool
}

func newDecision(s Snapshot, now time.Time) *decision {
	d := &decision{
		s:        s,
		now:      now,
		job:      s.Job,
		spec:     &s.Job.Spec,
		st:       *s.Job.Status.DeepCopy(),
		deleted:  map[string]bool{},
		signaled: map[string]bool{},
	}
	d.wasRunning = meta.IsStatusConditionTrue(d.st.Conditions, etjobv1.ConditionRunning)
	attempt := d.st.Restarts
	for _, p := range s.Pods {
		v := classify(&s, p)
		if v.role == etjobv1.RoleWorker && v.index >= d.st.NextWorkerIndex {
			// Names are never reused, even if a status write was lost.
			d.st.NextWorkerIndex = v.index + 1
		}
		switch {
		case v.attempt != attempt:
			d.stale = append(d.stale, v)
		case v.role == etjobv1.RoleLauncher:
			d.launcher = v
		case v.role == etjobv1.RoleWorker:
			d.workers = append(d.workers, v)
		}
	}
	sort.Slice(d.workers, func(i, j int) bool { return d.workers[i].index < d.workers[j].index })
	return d
}

// logSummary picks from a termination message (the end of a failed
// launcher's log) the lines that say why: the first two that read like an
// error (a shell's "not found", Python's "...Error: ..."), which come before
// the tracebacks they cause, else the last two lines; joined by " | " and
// cut to 400 bytes.
func logSummary(s string) string {
	var errs, all []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		all = append(all, l)
		if (strings.Contains(l, "Error:") || strings.Contains(l, "error:") || strings.Contains(l, "not found") ||
			strings.HasPrefix(l, "Failed") || strings.Contains(l, "No such file")) && !slices.Contains(errs, l) && len(errs) < 2 {
			errs = append(errs, l)
		}
	}
	if len(errs) == 0 && len(all) > 0 {
		errs = all[max(len(all)-2, 0):]
	}
	joined := strings.Join(errs, " | ")
	if len(joined) > 400 {
		joined = joined[:400] + "..."
	}
	return joined
}

func (d *decision) finished() bool {
	return meta.IsStatusConditionTrue(d.st.Conditions, etjobv1.ConditionComplete) ||
		meta.IsStatusConditionTrue(d.st.Conditions, etjobv1.ConditionFailed)
}

// finish cleans up a finished job per cleanPodPolicy and applies its TTL.
func (d *decision) finish() {
	d.setHosts(nil)
	for _, v := range d.all() {
		switch d.spec.CleanPodPolicy {
		case etjobv1.CleanPodPolicyAll:
			d.delete(v, etjobv1.ReasonFinished)
		case etjobv1.CleanPodPolicyNone:
		default: // Running
			if !v.terminal {
				d.delete(v, etjobv1.ReasonFinished)
			}
		}
	}
	if ttl := d.spec.TTLSecondsAfterFinished; ttl != nil && d.st.CompletionTime != nil {
		at := d.st.CompletionTime.Add(time.Duration(*ttl) * time.Second)
		if !d.now.Before(at) {
			d.plan.DeleteJob = true
		} else {
			d.requeueAt(at)
		}
	}
}

// suspend releases every pod while spec.suspend is true (batch/v1 Job parity).
func (d *decision) suspend() {
	for _, v := range d.all() {
		d.delete(v, etjobv1.ReasonUserSuspended)
	}
	if c := meta.FindStatusCondition(d.st.Conditions, etjobv1.ConditionSuspended); c == nil ||
		c.Status != metav1.ConditionTrue || c.Reason != etjobv1.ReasonUserSuspended {
		d.record(etjobv1.TimelineSuspend, "suspended by spec.suspend")
		d.event(false, "Suspended", "job suspended: all pods released")
	}
	d.setHosts(nil)
	d.st.StartTime = nil
	d.st.BelowMinSince = nil
	d.setCondition(etjobv1.ConditionSuspended, true, etjobv1.ReasonUserSuspended, "spec.suspend is true")
	d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonUserSuspended, "spec.suspend is true")
	d.setCondition(etjobv1.ConditionResizing, false, etjobv1.ReasonUserSuspended, "spec.suspend is true")
}

func (d *decision) run() {
	if d.st.StartTime == nil {
		d.st.StartTime = &metav1.Time{Time: d.now}
		if c := meta.FindStatusCondition(d.st.Conditions, etjobv1.ConditionSuspended); c != nil &&
			c.Status == metav1.ConditionTrue && c.Reason == etjobv1.ReasonUserSuspended {
			d.record(etjobv1.TimelineResume, "spec.suspend set to false")
			d.event(false, "Resumed", "job resumed")
			d.setCondition(etjobv1.ConditionSuspended, false, etjobv1.ReasonNotSuspended, "")
		}
	}
	if ad := d.spec.ActiveDeadlineSeconds; ad != nil {
		at := d.st.StartTime.Add(time.Duration(*ad) * time.Second)
		if !d.now.Before(at) {
			d.fail(etjobv1.ReasonDeadlineExceeded, fmt.Sprintf("job was active longer than spec.activeDeadlineSeconds (%ds)", *ad))
			return
		}
		d.requeueAt(at)
	}
	for _, v := range d.stale {
		d.restarting = true
		d.delete(v, etjobv1.ReasonRestarting)
	}
	// Completion first: once a torchrun member exited 0, the others finish or
	// fail on a closed rendezvous; neither is a failure of the job.
	if d.handleLauncher() || d.handleCompletion() || d.handleWorkers() {
		return
	}
	d.scale()
	d.publish()
	d.startHorovodLauncher()
	d.stopBelowMin()
	d.waitForCapacity()
	d.conditions()
}

// stopBelowMin: when a running job falls below minReplicas members, every
// remaining worker is told to checkpoint at the step all ranks agree on and
// stop, and the job waits for capacity with pending pods (the seed's "each
// worker receives a signal; rank 0 saves a checkpoint; the job is suspended").
// Idle survivors would otherwise hold their nodes, and torch agents waiting in
// a rendezvous give up after its join timeout.
func (d *decision) stopBelowMin() {
	if !d.wasRunning || len(d.members) >= int(d.spec.MinReplicas) {
		return
	}
	stopped := 0
	for _, w := range d.workers {
		if w.active() && w.ready && !d.deleted[w.pod.Name] && !d.signaled[w.pod.Name] {
			d.signal(w, etjobv1.ReasonWaitingForCapacity)
			stopped++
		}
	}
	if l := d.launcher; stopped > 0 && l != nil && d.spec.Framework == etjobv1.FrameworkHorovod && !l.terminal && !d.signaled[l.pod.Name] {
		// horovodrun ends once every rank left: marking it too makes its
		// exit a release whenever it comes (capacity may be back by then).
		d.signal(l, etjobv1.ReasonWaitingForCapacity)
	}
	if stopped > 0 {
		d.publish()
		d.record(etjobv1.TimelineStop, fmt.Sprintf("below spec.minReplicas (%d): %d workers told to checkpoint and stop", d.spec.MinReplicas, stopped))
	}
}

// handleLauncher deals with a finished or lost launcher. It reports whether the
// job restarted or finished.
func (d *decision) handleLauncher() bool {
	l := d.launcher
	if l == nil {
		// horovodrun starts once its workers are there (startHorovodLauncher).
		if !d.restarting && d.spec.Framework != etjobv1.FrameworkHorovod {
			d.plan.CreateLauncher = true
		}
		return false
	}
	if l.deleting {
		d.restarting = true // wait for the name to be free
		return false
	}
	if l.terminal && l.succeeded && d.spec.Framework == etjobv1.FrameworkHorovod {
		d.complete("launcher exited 0")
		return true
	}
	if l.noticed && !l.terminal && !l.lost {
		return d.moveLauncher(l)
	}
	if !l.terminal && !l.lost && !d.lostOnNotReadyNode(l) {
		return false
	}
	if l.terminal && d.spec.Framework == etjobv1.FrameworkHorovod && (l.released || d.horovodStopped()) {
		return d.releaseLauncher(l)
	}
	preempted := l.preempted || l.lost || !l.terminal
	reason := l.preemptReason
	if l.lost {
		reason = l.lostReason
	} else if !l.terminal {
		reason = "NodeNotReady"
	} else if !preempted {
		reason = "exit code " + strconv.Itoa(int(l.exitCode))
	}
	d.delete(l, reason)
	if preempted {
		d.st.Preemptions++
	}
	if why := logSummary(l.message); why != "" && !preempted {
		reason += ": " + why
	}
	// DESIGN: losing the rendezvous store / horovodrun without warning counts
	// against backoffLimit; a launcher whose node was noticed is a preemption
	// only (its node went before the move finished).
	if !l.noticed && !d.launcherMoving() {
		d.st.Failures++
	}
	msg := fmt.Sprintf("launcher %s lost (%s)", l.pod.Name, reason)
	switch {
	case !preempted && (l.exitCode == 126 || l.exitCode == 127):
		// The shell's "not executable" and "not found": the launcher image
		// lacks the command (horovodrun not installed). A retry cannot help.
		d.fail(etjobv1.ReasonLauncherFailed, fmt.Sprintf("launcher %s could not run its command (exit code %d: the image does not have it, or it is not executable): %s",
			l.pod.Name, l.exitCode, logSummary(l.message)))
	case d.st.Failures > BackoffLimit(d.spec):
		d.fail(etjobv1.ReasonBackoffLimit, msg+fmt.Sprintf("; %d failures exceed spec.backoffLimit (%d)", d.st.Failures, BackoffLimit(d.spec)))
	case preempted || d.spec.RestartPolicy == etjobv1.RestartPolicyOnFailure:
		d.restart(msg)
	default:
		d.fail(etjobv1.ReasonLauncherFailed, msg+"; spec.restartPolicy is Never")
	}
	return true
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

// horovodStopped reports whether etjob stopped this horovod job's training:
// it fell below minReplicas and its workers were told to checkpoint and stop.
// horovodrun then exits non-zero (every rank left), and that exit is etjob's
// doing, not a failure.
func (d *decision) horovodStopped() bool {
	c := meta.FindStatusCondition(d.s.Job.Status.Conditions, etjobv1.ConditionSuspended)
	return d.spec.Framework == etjobv1.FrameworkHorovod && c != nil && c.Status == metav1.ConditionTrue &&
		c.Reason == etjobv1.ReasonWaitingForCapacity
}

// releaseLauncher deletes a horovod launcher that ended after etjob stopped
// the job below minReplicas, counting it as neither a failure nor a
// preemption. horovodrun cannot wait below its minimum (a new one waits for
// -np slots and, without --network-interface, two hosts), so the job goes on
// as a restart: a new launcher once enough workers are ready again, resuming
// from the checkpoint of the agreed stop. It reports true: nothing else runs
// this pass.
func (d *decision) releaseLauncher(l *podView) bool {
	d.delete(l, etjobv1.ReasonWaitingForCapacity)
	msg := fmt.Sprintf("launcher %s ended after the stop below spec.minReplicas (%s); a new one starts when %d workers are ready",
		l.pod.Name, "exit code "+strconv.Itoa(int(l.exitCode)), d.spec.MinReplicas)
	d.restart(msg)
	d.setCondition(etjobv1.ConditionSuspended, true, etjobv1.ReasonWaitingForCapacity, msg)
	return true
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
	d.plan.CreateLauncher = true
}

// moveLauncher handles a reclamation notice on the launcher's node. The
// launcher hosts the torchrun rendezvous store (or horovodrun), which cannot
// move under running workers: every worker is told to checkpoint at the step
// all ranks agree on and stop; once they have (or their grace period is over)
// the job restarts from that checkpoint with a new launcher, which the
// scheduler places off the tainted node. Neither the move nor the workers'
// exits count as failures. It reports true: nothing else runs this pass.
func (d *decision) moveLauncher(l *podView) bool {
	told, waiting := 0, false
	for _, w := range d.workers {
		if w.deleting || w.terminal || w.lost {
			continue
		}
		if w.leaveAt.IsZero() {
			if !w.ready {
				continue // not training: nothing to save
			}
			w.leaveAt = d.now
			d.signal(w, etjobv1.ReasonLauncherMoving)
			told++
		}
		if at := d.leaveDeadline(w.leaveAt, l.noticeDeadline); d.now.Before(at) {
			d.requeueAt(at)
			waiting = true
		}
	}
	msg := fmt.Sprintf("the node of launcher %s is being reclaimed (%s)", l.pod.Name, l.noticeReason)
	if waiting {
		if told > 0 {
			d.record(etjobv1.TimelineMove, fmt.Sprintf("%s: %d workers told to checkpoint and stop", msg, told))
			d.event(false, etjobv1.ReasonLauncherMoving, msg+": the workers checkpoint and stop, then the job restarts on other capacity")
		}
		d.publish()
		d.recordMembership()
		d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonLauncherMoving, msg)
		d.setCondition(etjobv1.ConditionResizing, true, etjobv1.ReasonLauncherMoving, msg)
		return true
	}
	d.delete(l, l.noticeReason)
	d.st.Preemptions++
	d.restart(msg + ": restarting from the last checkpoint with a new launcher")
	return true
}

// launcherMoving reports whether the last pass was moving the launcher: its
// node may be gone by now, and the notice with it.
func (d *decision) launcherMoving() bool {
	c := meta.FindStatusCondition(d.s.Job.Status.Conditions, etjobv1.ConditionRunning)
	return c != nil && c.Reason == etjobv1.ReasonLauncherMoving
}

// handleWorkers classifies finished, lost and leaving workers. It reports
// whether the job restarted or finished.
func (d *decision) handleWorkers() bool {
	for _, w := range d.workers {
		if w.deleting {
			continue
		}
		switch {
		case w.terminal && w.succeeded:
			// completion, below
		case w.released:
			d.delete(w, w.leaveReason)
		case w.terminal && w.preempted:
			d.preempted(w, w.preemptReason)
		case w.terminal:
			if d.workerFailed(w) {
				return true
			}
		case w.lost:
			d.preempted(w, w.lostReason)
		case d.lostOnNotReadyNode(w):
			d.preempted(w, "NodeNotReady")
		case w.leaving():
			d.leave(w)
		}
	}
	return false
}

func (d *decision) preempted(w *podView, reason string) {
	d.delete(w, reason)
	d.st.Preemptions++
	d.record(etjobv1.TimelineLeave, fmt.Sprintf("%s preempted (%s)", w.pod.Name, reason))
	d.event(false, "Preempted", fmt.Sprintf("worker %s preempted (%s); not counted as a failure", w.pod.Name, reason))
}

// workerFailed applies workerRestartPolicy to a worker that failed for a reason
// other than a preemption. It reports whether the job restarted or failed.
func (d *decision) workerFailed(w *podView) bool {
	d.st.Failures++
	msg := fmt.Sprintf("worker %s failed with exit code %d", w.pod.Name, w.exitCode)
	if d.st.Failures > BackoffLimit(d.spec) {
		d.fail(etjobv1.ReasonBackoffLimit, msg+fmt.Sprintf("; %d failures exceed spec.backoffLimit (%d)", d.st.Failures, BackoffLimit(d.spec)))
		return true
	}
	retry := false
	switch d.spec.WorkerRestartPolicy {
	case etjobv1.WorkerRestartAlways, etjobv1.WorkerRestartOnFailure:
		retry = true
	case etjobv1.WorkerRestartExitCode:
		retry = retryableExit(w.exitCode)
	}
	switch {
	case retry:
		d.delete(w, etjobv1.ReasonWorkerFailed)
		d.record(etjobv1.TimelineLeave, msg)
		d.event(true, etjobv1.ReasonWorkerFailed, msg+"; replacing it under a new name")
		return false
	case d.spec.RestartPolicy == etjobv1.RestartPolicyOnFailure:
		d.restart(msg)
	default:
		d.fail(etjobv1.ReasonWorkerFailed, msg+fmt.Sprintf("; spec.workerRestartPolicy is %s and spec.restartPolicy is Never", d.spec.WorkerRestartPolicy))
	}
	return true
}

// leave tells a leaving worker to go (once) and deletes it when it has had its
// grace period, or at once when it never started work.
func (d *decision) leave(w *podView) {
	if w.leaveAt.IsZero() {
		w.leaveAt = d.now
		w.leaveReason = w.noticeReason
		d.signal(w, w.noticeReason)
	}
	if !w.scheduled || (!w.ready && w.pod.Status.Phase == corev1.PodPending) {
		if w.noticed {
			d.preempted(w, w.noticeReason)
		} else {
			d.delete(w, w.leaveReason)
		}
		return
	}
	var nodeDeadline time.Time
	if w.noticed {
		nodeDeadline = w.noticeDeadline
	}
	at := d.leaveDeadline(w.leaveAt, nodeDeadline)
	if d.now.Before(at) {
		d.requeueAt(at)
		return
	}
	if w.noticed || !isRelease(w.leaveReason) {
		d.preempted(w, "LeaveGracePeriodExpired")
	} else {
		d.delete(w, "LeaveGracePeriodExpired")
	}
}

// leaveDeadline is when a worker told to leave at leaveAt is given up on:
// after the leave grace period, or at the deadline of the notice on the node
// it waits for (its own node's; the launcher's, for a move) when that is
// later: the node lives until then, so a checkpoint longer than the grace
// period still completes (found by the trace simulator).
func (d *decision) leaveDeadline(leaveAt, nodeDeadline time.Time) time.Time {
	at := leaveAt.Add(d.leaveGrace())
	if nodeDeadline.After(at) {
		return nodeDeadline
	}
	return at
}

func (d *decision) leaveGrace() time.Duration {
	if sp := d.spec.Spot; sp != nil {
		return time.Duration(sp.LeaveGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// lostOnNotReadyNode: maxWaitTime bounds how long a pod on a NotReady node is
// tolerated (0 = no limit; Kubernetes' own taint eviction still applies).
func (d *decision) lostOnNotReadyNode(v *podView) bool {
	if v.notReadySince.IsZero() || d.spec.MaxWaitTime <= 0 || v.terminal {
		return false
	}
	at := v.notReadySince.Add(time.Duration(d.spec.MaxWaitTime) * time.Second)
	if d.now.Before(at) {
		d.requeueAt(at)
		return false
	}
	return true
}

// handleCompletion: for torchrun the first worker that exits 0 starts
// completion; the job completes when no member still runs, or after a grace
// period. It reports whether the job finished or is finishing.
func (d *decision) handleCompletion() bool {
	if d.spec.Framework != etjobv1.FrameworkTorchrun {
		return false
	}
	var first time.Time
	found := false
	running := 0
	for _, w := range d.workers {
		if w.succeeded {
			t := w.finishedAt
			if t.IsZero() {
				t = d.now
			}
			if !found || t.Before(first) {
				first = t
			}
			found = true
		} else if !w.terminal && !w.deleting && !d.deleted[w.pod.Name] && w.scheduled {
			running++
		}
	}
	if !found {
		return false
	}
	at := first.Add(CompletionGracePeriod)
	if running == 0 || !d.now.Before(at) {
		d.complete("a worker exited 0 and the other members finished")
		return true
	}
	d.requeueAt(at)
	d.publish()
	d.recordMembership()
	// Members leave the membership as they finish: that is completion, not a
	// fall below min.
	msg := fmt.Sprintf("a worker exited 0: waiting up to %s for the %d others to finish", CompletionGracePeriod, running)
	d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonCompleting, msg)
	d.setCondition(etjobv1.ConditionResizing, false, etjobv1.ReasonCompleting, msg)
	return true
}

// scale brings the number of active workers to the desired size: new workers
// up to desired (never above maxReplicas pods alive, bounded per pass), and on a
// scale-in the named workers, then the highest indices, told to leave.
func (d *decision) scale() {
	desired := d.desired()
	var active []*podView
	alive := 0
	for _, w := range d.workers {
		if d.deleted[w.pod.Name] || w.deleting || w.terminal {
			continue
		}
		alive++
		if w.active() {
			active = append(active, w)
		}
	}
	if n := int32(len(active)) - desired; n > 0 {
		victims := slices.Clone(active)
		sort.SliceStable(victims, func(i, j int) bool {
			if victims[i].scaleIn != victims[j].scaleIn {
				return victims[i].scaleIn
			}
			return victims[i].index > victims[j].index
		})
		for _, v := range victims[:n] {
			if v.ready {
				d.signal(v, etjobv1.ReasonScaleIn)
			} else {
				d.delete(v, etjobv1.ReasonScaleIn)
			}
		}
		d.record(etjobv1.TimelineScale, fmt.Sprintf("scale in to %d workers", desired))
		return
	}
	if d.restarting {
		return
	}
	n := desired - int32(len(active))
	n = min(n, MaxCreatesPerPass, d.spec.MaxReplicas-int32(alive))
	for range max(n, 0) {
		d.created = append(d.created, d.st.NextWorkerIndex)
		d.st.NextWorkerIndex++
	}
	d.plan.CreateWorkers = d.created
}

func (d *decision) desired() int32 {
	return max(d.spec.MinReplicas, min(d.spec.Replicas, d.spec.MaxReplicas))
}

// publish computes the membership: ready workers that are not leaving, by
// index, at most maxReplicas. A change bumps the generation, which never goes
// back.
func (d *decision) publish() {
	slots := SlotsPerWorker(d.spec)
	d.members = d.members[:0]
	for _, w := range d.workers {
		if w.ready && w.active() && !d.deleted[w.pod.Name] && !d.signaled[w.pod.Name] {
			d.members = append(d.members, w)
		}
	}
	if len(d.members) > int(d.spec.MaxReplicas) {
		d.members = d.members[:d.spec.MaxReplicas]
	}
	d.batchJoiners()
	hosts := make([]string, 0, len(d.members))
	for _, w := range d.members {
		hosts = append(hosts, FormatHost(w.pod.Name, slots))
	}
	d.setHosts(hosts)
}

// batchJoiners holds back workers that became ready less than
// JoinBatchWindow ago while others are bound and still starting, so that a
// scale-out joins at once. Only a job that keeps minReplicas members without
// them waits: a job below min resumes the moment it can.
func (d *decision) batchJoiners() {
	published := map[string]bool{}
	for _, h := range d.s.Job.Status.Membership.Hosts {
		published[HostName(h)] = true
	}
	var staying, joining []*podView
	for _, w := range d.members {
		if published[w.pod.Name] {
			staying = append(staying, w)
		} else {
			joining = append(joining, w)
		}
	}
	d.joining = nil
	if len(joining) == 0 || len(staying) < int(d.spec.MinReplicas) {
		return
	}
	starting := false
	for _, w := range d.workers {
		if w.active() && w.scheduled && !w.ready && !d.deleted[w.pod.Name] {
			starting = true
		}
	}
	first := time.Time{}
	for _, w := range joining {
		if !w.readySince.IsZero() && (first.IsZero() || w.readySince.Before(first)) {
			first = w.readySince
		}
	}
	if !starting || first.IsZero() || !d.now.Before(first.Add(JoinBatchWindow)) {
		return
	}
	d.members = staying
	d.joining = map[string]bool{}
	for _, w := range joining {
		d.joining[w.pod.Name] = true
	}
	d.requeueAt(first.Add(JoinBatchWindow))
}

// setHosts sets the membership this pass publishes. The generation is the
// last published one plus one if the hosts differ from it, however many times
// a pass recomputes them.
func (d *decision) setHosts(hosts []string) {
	orig := d.s.Job.Status.Membership
	if slices.Equal(orig.Hosts, hosts) {
		d.st.Membership = *orig.DeepCopy()
		return
	}
	if len(hosts) == 0 {
		hosts = nil
	}
	d.st.Membership = etjobv1.MembershipStatus{Generation: orig.Generation + 1, Hosts: hosts, ChangeTime: &metav1.Time{Time: d.now}}
}

// recordMembership emits the plan's membership, a timeline entry and an Event
// when this pass changed it.
func (d *decision) recordMembership() {
	orig, m := d.s.Job.Status.Membership, d.st.Membership
	if m.Generation == orig.Generation || d.plan.Membership != nil {
		return
	}
	d.plan.Membership = &m
	joined, left := diff(orig.Hosts, m.Hosts)
	switch {
	case len(joined) > 0 && len(left) == 0:
		d.record(etjobv1.TimelineJoin, "joined: "+strings.Join(joined, ", "))
	case len(left) > 0 && len(joined) == 0:
		d.record(etjobv1.TimelineLeave, "left: "+strings.Join(left, ", "))
	default:
		d.record(etjobv1.TimelineChange, fmt.Sprintf("joined: %s; left: %s", strings.Join(joined, ", "), strings.Join(left, ", ")))
	}
	d.event(false, "MembershipChanged", fmt.Sprintf("generation %d: %d members", m.Generation, len(m.Hosts)))
}

func diff(old, cur []string) (joined, left []string) {
	for _, h := range cur {
		if !slices.Contains(old, h) {
			joined = append(joined, HostName(h))
		}
	}
	for _, h := range old {
		if !slices.Contains(cur, h) {
			left = append(left, HostName(h))
		}
	}
	return joined, left
}

// waitForCapacity applies maxWaitTime while the job is below minReplicas
// members: scheduled workers are held at most that long, then released; the
// job keeps waiting with pending pods.
func (d *decision) waitForCapacity() {
	if len(d.members) >= int(d.spec.MinReplicas) {
		d.st.BelowMinSince = nil
		return
	}
	if d.st.BelowMinSince == nil {
		d.st.BelowMinSince = &metav1.Time{Time: d.now}
	}
	if d.spec.MaxWaitTime <= 0 {
		return
	}
	at := d.st.BelowMinSince.Add(time.Duration(d.spec.MaxWaitTime) * time.Second)
	if d.now.Before(at) {
		d.requeueAt(at)
		return
	}
	released := 0
	for _, w := range d.workers {
		if w.scheduled && w.active() && !d.deleted[w.pod.Name] {
			d.delete(w, etjobv1.ReasonMaxWaitTimeExceeded)
			released++
		}
	}
	if released > 0 {
		d.publish() // the released members leave the membership now
		msg := fmt.Sprintf("below spec.minReplicas (%d) for spec.maxWaitTime (%ds): released %d idle workers; waiting with pending pods",
			d.spec.MinReplicas, d.spec.MaxWaitTime, released)
		d.event(true, etjobv1.ReasonMaxWaitTimeExceeded, msg)
		d.record(etjobv1.TimelineRelease, msg)
	}
	d.st.BelowMinSince = &metav1.Time{Time: d.now}
	d.requeueAt(d.now.Add(time.Duration(d.spec.MaxWaitTime) * time.Second))
}

// conditions sets Running, Suspended (WaitingForCapacity) and Resizing from
// the membership this pass publishes.
func (d *decision) conditions() {
	d.recordMembership()
	n, lo, hi := len(d.members), int(d.spec.MinReplicas), int(d.spec.MaxReplicas)
	if n >= lo && n <= hi {
		d.setCondition(etjobv1.ConditionRunning, true, etjobv1.ReasonMembersReady,
			fmt.Sprintf("%d members (min %d, max %d), generation %d", n, lo, hi, d.st.Membership.Generation))
		d.setCondition(etjobv1.ConditionSuspended, false, etjobv1.ReasonNotSuspended, "")
	} else {
		why := d.waitingMessage()
		d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonWaitingForCapacity, why)
		suspended := meta.IsStatusConditionTrue(d.st.Conditions, etjobv1.ConditionSuspended)
		if d.wasRunning || suspended {
			if !suspended {
				d.record(etjobv1.TimelineSuspend, "below spec.minReplicas: waiting for capacity")
				d.event(true, etjobv1.ReasonWaitingForCapacity, why)
			}
			d.setCondition(etjobv1.ConditionSuspended, true, etjobv1.ReasonWaitingForCapacity, why)
		}
	}
	if n >= lo && meta.IsStatusConditionTrue(d.s.Job.Status.Conditions, etjobv1.ConditionSuspended) &&
		meta.FindStatusCondition(d.s.Job.Status.Conditions, etjobv1.ConditionSuspended).Reason == etjobv1.ReasonWaitingForCapacity {
		d.record(etjobv1.TimelineResume, "capacity returned: resuming from the last checkpoint")
		d.event(false, "Resumed", "capacity returned: resuming from the last checkpoint")
	}
	active, leaving := d.counts()
	desired := int(d.desired())
	switch {
	case leaving > 0:
		d.setCondition(etjobv1.ConditionResizing, true, etjobv1.ReasonWorkersLeaving, fmt.Sprintf("%d workers leaving", leaving))
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
	return msg
}

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

// restart restarts the whole job: every pod of this attempt goes, and the next
// attempt (a new rendezvous id) starts once they are gone.
func (d *decision) restart(msg string) {
	d.st.Restarts++
	for _, v := range d.all() {
		d.delete(v, etjobv1.ReasonRestarting)
	}
	d.setHosts(nil)
	d.st.BelowMinSince = nil
	d.record(etjobv1.TimelineRestart, msg)
	d.event(true, etjobv1.ReasonRestarting, fmt.Sprintf("restarting the job (restart %d): %s", d.st.Restarts, msg))
	d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonRestarting, msg)
	d.setCondition(etjobv1.ConditionResizing, false, etjobv1.ReasonRestarting, msg)
	d.workers = nil
}

func (d *decision) complete(msg string) {
	d.setCondition(etjobv1.ConditionComplete, true, etjobv1.ReasonSucceeded, msg)
	d.finishWith(etjobv1.TimelineComplete, msg, false)
}

func (d *decision) fail(reason, msg string) {
	d.setCondition(etjobv1.ConditionFailed, true, reason, msg)
	d.finishWith(etjobv1.TimelineFail, msg, true)
}

func (d *decision) finishWith(kind, msg string, warning bool) {
	d.st.CompletionTime = &metav1.Time{Time: d.now}
	d.setCondition(etjobv1.ConditionRunning, false, etjobv1.ReasonFinished, msg)
	d.setCondition(etjobv1.ConditionResizing, false, etjobv1.ReasonFinished, msg)
	d.setCondition(etjobv1.ConditionSuspended, false, etjobv1.ReasonFinished, msg)
	d.st.BelowMinSince = nil
	d.record(kind, msg)
	d.event(warning, kind+"d", msg)
	d.finish()
}

// summarize fills the counts, the per-worker list and the summary column.
func (d *decision) summarize() {
	d.recordMembership()
	// A pod deleted in this pass needs no signal.
	d.plan.Signal = slices.DeleteFunc(d.plan.Signal, func(s Signal) bool { return d.deleted[s.Pod] })
	st := &d.st
	st.ObservedGeneration = d.job.Generation
	st.SlotsPerWorker = SlotsPerWorker(d.spec)
	st.Desired = fmt.Sprintf("%d (%d-%d)", d.spec.Replicas, d.spec.MinReplicas, d.spec.MaxReplicas)
	st.Selector = etjobv1.LabelJobName + "=" + d.job.Name + "," + etjobv1.LabelRole + "=" + etjobv1.RoleWorker
	memberSet := map[string]bool{}
	for _, h := range st.Membership.Hosts {
		memberSet[HostName(h)] = true
	}
	st.Workers = st.Workers[:0]
	st.Replicas, st.ReadyReplicas, st.LeavingReplicas = 0, 0, 0
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
			st.LeavingReplicas++
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
		if ws.State == etjobv1.WorkerMember || ws.State == etjobv1.WorkerReady || ws.State == etjobv1.WorkerStarting || ws.State == etjobv1.WorkerPending {
			st.Replicas++
			if w.ready && !d.joining[w.pod.Name] {
				st.ReadyReplicas++
			}
		}
		st.Workers = append(st.Workers, ws)
	}
	for _, i := range d.created {
		st.Workers = append(st.Workers, etjobv1.WorkerStatus{Name: WorkerName(d.job.Name, i), Index: i, State: etjobv1.WorkerPending})
		st.Replicas++
	}
	if len(st.Workers) == 0 {
		st.Workers = nil
	}
	st.Members = int32(len(st.Membership.Hosts))
	d.lastCheckpoint()
	for _, e := range d.timeline {
		e.Generation = st.Membership.Generation
		e.Members = st.Members
		st.Timeline = append(st.Timeline, e)
	}
	if over := len(st.Timeline) - TimelineLimit; over > 0 {
		st.Timeline = slices.Clone(st.Timeline[over:])
	}
	st.Summary = d.summary()
	d.plan.Status = *st
	d.plan.RequeueAfter = d.plan.RequeueAfter.Round(time.Millisecond)
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
	if best != nil && (d.st.LastCheckpoint == nil || best.Step >= d.st.LastCheckpoint.Step) {
		cp := &etjobv1.CheckpointStatus{Step: best.Step, Path: best.Path, DurationMilliseconds: int64(best.Seconds * 1000)}
		if t, err := time.Parse(time.RFC3339, best.Time); err == nil {
			cp.Time = &metav1.Time{Time: t}
		}
		d.st.LastCheckpoint = cp
	}
	if d.finished() || d.st.LastCheckpoint == nil || d.st.LastCheckpoint.DurationMilliseconds <= 0 {
		return
	}
	took := time.Duration(d.st.LastCheckpoint.DurationMilliseconds) * time.Millisecond
	slow := ""
	for _, w := range d.members {
		if window, ok := UsableNoticeWindow[w.provider]; ok && took > window {
			slow = fmt.Sprintf("the last checkpoint took %s, longer than the ~%s a %s reclamation notice leaves (worker %s): a noticed loss there would lose the steps since the previous checkpoint",
				took.Round(100*time.Millisecond), window, w.provider, w.pod.Name)
			break
		}
	}
	was := meta.IsStatusConditionTrue(d.st.Conditions, etjobv1.ConditionCheckpointTooSlow)
	switch {
	case slow != "":
		if !was {
			d.event(true, etjobv1.ConditionCheckpointTooSlow, slow)
		}
		d.setCondition(etjobv1.ConditionCheckpointTooSlow, true, etjobv1.ConditionCheckpointTooSlow, slow)
	case was:
		d.setCondition(etjobv1.ConditionCheckpointTooSlow, false, "CheckpointInTime", "")
	}
}

func (d *decision) summary() string {
	c := d.st.Conditions
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

// Helpers.

func (d *decision) all() []*podView {
	out := slices.Clone(d.stale)
	if d.launcher != nil {
		out = append(out, d.launcher)
	}
	return append(out, d.workers...)
}

func (d *decision) delete(v *podView, reason string) {
	if v.deleting || d.deleted[v.pod.Name] {
		return
	}
	d.deleted[v.pod.Name] = true
	d.plan.Delete = append(d.plan.Delete, Deletion{Name: v.pod.Name, Reason: reason})
}

func (d *decision) signal(v *podView, reason string) {
	if d.signaled[v.pod.Name] {
		return
	}
	d.signaled[v.pod.Name] = true
	if v.leaveAt.IsZero() || v.leaveAt.Equal(d.now) {
		d.plan.Signal = append(d.plan.Signal, Signal{Pod: v.pod.Name, At: d.now, Reason: reason})
		d.requeueAt(d.now.Add(d.leaveGrace()))
	}
}

func (d *decision) requeueAt(t time.Time) {
	after := t.Sub(d.now)
	if after <= 0 {
		after = time.Millisecond
	}
	if d.plan.RequeueAfter == 0 || after < d.plan.RequeueAfter {
		d.plan.RequeueAfter = after
	}
}

func (d *decision) event(warning bool, reason, msg string) {
	d.plan.Events = append(d.plan.Events, Event{Warning: warning, Reason: reason, Message: msg})
}

func (d *decision) record(kind, msg string) {
	d.timeline = append(d.timeline, etjobv1.TimelineEvent{Time: metav1.Time{Time: d.now}, Type: kind, Message: msg})
}

func (d *decision) setCondition(t string, status bool, reason, msg string) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	if reason == "" {
		reason = t
	}
	meta.SetStatusCondition(&d.st.Conditions, metav1.Condition{
		Type: t, Status: s, Reason: reason, Message: msg,
		ObservedGeneration: d.job.Generation, LastTransitionTime: metav1.Time{Time: d.now},
	})
}
