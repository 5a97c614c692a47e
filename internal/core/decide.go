package core

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Decide returns what should be done for one ElasticJob, given what was
// observed and the current time. It is pure: the same snapshot and time always
// give the same plan.
//
// One pass takes exactly one of four paths, then records and summarizes:
//
//  1. a finished job is cleaned up and its TTL applied (completion.go);
//  2. a horovod job whose launcher cannot work fails at once (launcher.go),
//     and so does a job whose pods the API server refused as invalid
//     (launcher.go: invalidPodTemplate);
//  3. spec.suspend releases every pod (suspend.go);
//  4. otherwise the job runs: see run for the order of its policies;
//
// then the membership the path elected or cleared is published and its
// change recorded (membership.go), before the conditions that the run path
// sets from it (status.go); the newest checkpoint is read (status.go); and
// build writes the Plan and the Status, the one place that does.
func Decide(s Snapshot, now time.Time) Plan {
	d := newDecision(s, now)
	invalid := d.invalidHorovodLauncher()
	refused := d.invalidPodTemplate()
	conditions := false
	switch {
	case d.finished():
		d.finish()
	case invalid != "":
		d.fail(etjobv1.ReasonInvalidLauncher, invalid)
	case refused != "":
		d.fail(etjobv1.ReasonPodTemplateInvalid, refused)
	case d.job.Spec.Suspend != nil && *d.job.Spec.Suspend:
		d.suspend()
	default:
		conditions = d.run()
	}
	d.publish()
	// The membership change is recorded before the Suspend or Resume that
	// it causes, so the timeline and the Events read in that order.
	d.recordMembership()
	if conditions {
		d.conditions()
	}
	d.lastCheckpoint()
	return d.build()
}

// build writes the pass's Plan and the job's new Status from what the
// policies decided: the one place that writes either. Every status field
// the pass may change is assigned here from the decision's typed facts (the
// lifecycle moves, the counts, the membership, the conditions, the growth
// state); the rest is the observed status, unchanged.
func (d *decision) build() Plan {
	st := *d.s.Job.Status.DeepCopy()
	st.ObservedGeneration = d.job.Generation
	st.Conditions = d.conds
	st.StartTime = d.startTime()
	st.CompletionTime = d.completionTime()
	st.Restarts = d.restarts()
	st.LauncherReplacements = d.launcherReplacements()
	st.BelowMinSince = d.belowMinSince()
	st.Failures, st.Preemptions = d.failures, d.preemptions
	st.NextWorkerIndex = d.nextIndex
	st.Membership = d.membership
	st.Members = int32(len(st.Membership.Hosts))
	st.Growth = d.growth
	st.LastCheckpoint = d.checkpoint
	st.SlotsPerWorker = etjobv1.SlotsPerWorker(d.spec)
	st.Ranks = st.Members * st.SlotsPerWorker
	st.Desired = fmt.Sprintf("%d (%d-%d)", d.spec.Replicas, d.spec.MinReplicas, d.spec.MaxReplicas)
	st.Selector = etjobv1.LabelJobName + "=" + d.job.Name + "," + etjobv1.LabelRole + "=" + etjobv1.RoleWorker
	st.Workers, st.Replicas, st.ReadyReplicas, st.LeavingReplicas = d.workerStatuses(st.Membership)
	st.Training = d.training()
	st.Timeline = d.stampTimeline(st.Timeline, st.Membership.Generation, st.Members)
	st.Summary = d.summary()

	plan := Plan{
		CreateLauncher: d.createLauncher,
		CreateWorkers:  d.created,
		ExtraWorkers:   d.extra,
		AvoidNodes:     d.avoid,
		Delete:         d.deletions,
		// A pod deleted in this pass needs no signal.
		Signal:    slices.DeleteFunc(d.signals, func(s Signal) bool { return d.deleted[s.Pod] }),
		Events:    d.events,
		DeleteJob: d.deleteJob,
	}
	if st.Membership.Generation != d.s.Job.Status.Membership.Generation {
		m := st.Membership
		plan.Membership = &m
	}
	// Whole milliseconds, rounded up: a requeue must never come before its
	// deadline. Rounded to the nearest, a deadline less than half a
	// millisecond away gave 0 (no requeue at all), and a finished job whose
	// last pass fell there was never deleted after its TTL.
	if r := d.requeue; r > 0 {
		d.requeue = (r + time.Millisecond - 1).Truncate(time.Millisecond)
	}
	// The bill follows every other field: it is brought up to date when the
	// status changes (cost.go).
	var recheck time.Time
	st.Cost, recheck = d.bill(st)
	if !recheck.IsZero() {
		d.requeueAt(recheck)
	}
	plan.RequeueAfter = d.requeue
	for i := range plan.Delete {
		c := d.counted[plan.Delete[i].Name]
		plan.Delete[i].Failures, plan.Delete[i].Preemptions = c.Failures, c.Preemptions
	}
	plan.Status = st
	return plan
}

// run decides for a job that is neither finished nor suspended. The steps, in
// this order, each in the file of its policy:
//
//  1. resume (suspend.go): status.startTime; the Resumed Event after spec.suspend.
//  2. deadlineExceeded (completion.go): spec.activeDeadlineSeconds fails the job.
//  3. deleteStale (failures.go): the pods of earlier attempts go; a restart
//     creates nothing until they are gone.
//     leaveOverPrice (price.go) tells the workers on nodes priced above
//     spec.spot.maxPricePerHour to leave, and leaveOverBudget the dearest
//     while the workers cost more than spec.spot.budgetPerHour.
//  4. handleLauncher (launcher.go), handleCompletion (completion.go) and
//     handleWorkers (failures.go, leaving.go); the first that does not
//     proceed ends the pass. Completion comes before the workers: once a
//     torchrun member exited 0 the others finish or fail on a closed
//     rendezvous, and neither is a failure of the job. A step that holds (a
//     launcher move, a completion in progress) ends the pass with the
//     membership elected without the workers it told to stop or that
//     finished.
//  5. replaceStalled (heartbeat.go): members whose heartbeats show them
//     stuck while others train, or split off into another round or world
//     size, are deleted (TrainingStalled); scale then replaces them.
//     scale (scaling.go): new workers up to the desired size, or leavers;
//     extra workers above it under spec.growth (growth.go).
//  6. elect (membership.go): the membership from the ready workers.
//  7. startHorovodLauncher (launcher.go): horovodrun once step 6 found
//     enough members.
//  8. stopBelowMin and waitForCapacity (capacity.go): below minReplicas the
//     survivors are told to stop and, after maxWaitTime, idle workers are
//     released; if either did, the membership is elected once more,
//     without them: its rules must see who was told (Horovod's would
//     otherwise give the horovodrun stopped here a host it never had).
//     That second election can wait for both: waitForCapacity reads the
//     members only to compare their number with minReplicas, and
//     stopBelowMin stops workers only when they are already fewer.
//
// It reports whether the pass reached its end: Decide then sets the
// conditions (status.go) from the membership it published.
func (d *decision) run() bool {
	d.resume()
	if d.deadlineExceeded() {
		return false
	}
	d.deleteStale()
	d.leaveOverPrice()
	d.leaveOverBudget()
	for _, step := range []func() outcome{d.handleLauncher, d.handleCompletion, d.handleWorkers} {
		switch step() {
		case ended:
			return false
		case hold:
			d.elect()
			return false
		}
	}
	d.replaceStalled()
	d.scale()
	d.elect()
	d.startHorovodLauncher()
	stopped := d.stopBelowMin()
	released := d.waitForCapacity()
	if stopped || released {
		d.elect()
	}
	return true
}

// outcome is what a step of run leaves to the rest of the pass.
type outcome int

const (
	// proceed: the step decided nothing that ends the pass.
	proceed outcome = iota
	// hold: the job keeps running while something finishes (the workers
	// checkpoint for a launcher move, the members finish after a torchrun
	// completion): the pass elects the membership and ends.
	hold
	// ended: the job restarted or finished; the pass ends.
	ended
)

// decision is one pass of Decide: what was observed, classified, and what
// the policies decided, as typed facts. The policies add to it through the
// primitives below (delete, signal, count, requeueAt, event, record,
// setCondition) and through their own fields; none writes the Plan or the
// Status: build does, from these.
type decision struct {
	s    Snapshot
	now  time.Time
	job  *etjobv1.ElasticJob
	spec *etjobv1.ElasticJobSpec

	workers  []*podView // current attempt, by index
	launcher *podView   // current attempt
	stale    []*podView // older attempts
	// pods are every pod of the snapshot, classified; unlike workers (which
	// a restart empties) they stay what was observed: the bill reads them.
	pods []*podView
	// wasRunning: the Running condition was true before this pass.
	wasRunning bool

	// What the plan carries.
	deletions      []Deletion
	signals        []Signal
	events         []Event
	requeue        time.Duration
	createLauncher bool
	created        []int32 // new workers' indices (scale)
	extra          []int32 // those of them above spec.replicas (growth)
	avoid          []string
	deleteJob      bool
	deleted        map[string]bool
	signaled       map[string]bool
	// counted: what this pass counted for each pod (build writes it into
	// the pod's deletion).
	counted map[string]Deletion

	// What the status carries, each field written by build alone.
	conds    []metav1.Condition
	timeline []etjobv1.TimelineEvent
	// The job's lifecycle moves this pass: resumed (status.startTime set),
	// suspended (spec.suspend), restarted, finished (completed or failed),
	// and a launcher created to replace one.
	resumed, suspended, restarted, finishedNow, launcherReplaced bool
	// wait is maxWaitTime's verdict, when the pass judged it (capacity.go).
	wait                  *waitVerdict
	failures, preemptions int32
	nextIndex             int32
	membership            etjobv1.MembershipStatus
	growth                *etjobv1.GrowthStatus
	checkpoint            *etjobv1.CheckpointStatus

	// budgetShort: workers the budget kept this pass from creating
	// (scale), and the budget left then.
	budgetShort int32
	budgetLeft  etjobv1.PricePerHour
	// members are the workers elected this pass; hosts, when not nil, the
	// membership that publish writes (elected, or cleared).
	members    []*podView
	hosts      *[]string
	restarting bool
	// joining are ready workers held back by batchJoiners this pass.
	joining map[string]bool
	// heldForHandover are ready workers that horovodHandover kept from a
	// horovodrun that cannot take them: they wait for the next one.
	heldForHandover map[string]bool
}

// newDecision sorts the snapshot's pods into the current attempt's launcher
// and workers (by index) and the pods of earlier attempts.
func newDecision(s Snapshot, now time.Time) *decision {
	old := s.Job.Status.DeepCopy()
	d := &decision{
		s:        s,
		now:      now,
		job:      s.Job,
		spec:     &s.Job.Spec,
		deleted:  map[string]bool{},
		signaled: map[string]bool{},
		counted:  map[string]Deletion{},

		conds:       old.Conditions,
		failures:    old.Failures,
		preemptions: old.Preemptions,
		nextIndex:   old.NextWorkerIndex,
		membership:  old.Membership,
		growth:      old.Growth,
		checkpoint:  old.LastCheckpoint,

		heldForHandover: map[string]bool{},
	}
	d.wasRunning = meta.IsStatusConditionTrue(d.conds, etjobv1.ConditionRunning)
	attempt := old.Restarts
	for _, p := range s.Pods {
		v := classify(&s, p)
		d.pods = append(d.pods, v)
		if v.role == etjobv1.RoleWorker && v.index >= d.nextIndex {
			// Names are never reused, even if a status write was lost.
			d.nextIndex = v.index + 1
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

// The lifecycle's status fields as this pass leaves them.

// startTime is status.startTime: set when the job resumed this pass,
// cleared while it is suspended.
func (d *decision) startTime() *metav1.Time {
	switch {
	case d.suspended:
		return nil
	case d.resumed:
		return &metav1.Time{Time: d.now}
	}
	return d.s.Job.Status.StartTime.DeepCopy()
}

// completionTime is status.completionTime: now when the job finished this
// pass.
func (d *decision) completionTime() *metav1.Time {
	if d.finishedNow {
		return &metav1.Time{Time: d.now}
	}
	return d.s.Job.Status.CompletionTime.DeepCopy()
}

// restarts is status.restarts, one more when the job restarted this pass.
func (d *decision) restarts() int32 {
	if d.restarted {
		return d.s.Job.Status.Restarts + 1
	}
	return d.s.Job.Status.Restarts
}

// launcherReplacements is status.launcherReplacements: a new attempt (a
// restart, or a resume after spec.suspend) starts at 0, and its first
// launcher replaces none.
func (d *decision) launcherReplacements() int32 {
	switch {
	case d.restarted || d.suspended:
		return 0
	case d.launcherReplaced:
		return d.s.Job.Status.LauncherReplacements + 1
	}
	return d.s.Job.Status.LauncherReplacements
}

// belowMinSince is status.belowMinSince: maxWaitTime's verdict when the pass
// judged it; cleared when the job restarts, is suspended or finishes.
func (d *decision) belowMinSince() *metav1.Time {
	switch {
	case d.restarted || d.suspended || d.finishedNow:
		return nil
	case d.wait != nil:
		return d.wait.Since
	}
	return d.s.Job.Status.BelowMinSince.DeepCopy()
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

// The primitives every policy builds on.

// all returns every pod of the job: earlier attempts', the launcher, the workers.
func (d *decision) all() []*podView {
	out := slices.Clone(d.stale)
	if d.launcher != nil {
		out = append(out, d.launcher)
	}
	return append(out, d.workers...)
}

// delete plans the deletion of a pod, once, unless it is already going.
func (d *decision) delete(v *podView, reason string) {
	if v.deleting || d.deleted[v.pod.Name] {
		return
	}
	d.deleted[v.pod.Name] = true
	d.deletions = append(d.deletions, Deletion{Name: v.pod.Name, Reason: reason})
}

// signal marks a pod as told to checkpoint and leave. The plan annotates it
// unless an earlier pass did, and then looks again after the leave grace
// period.
func (d *decision) signal(v *podView, reason string) {
	if d.signaled[v.pod.Name] {
		return
	}
	d.signaled[v.pod.Name] = true
	if v.leaveAt.IsZero() || v.leaveAt.Equal(d.now) {
		d.signals = append(d.signals, Signal{Pod: v.pod.Name, At: d.now, Reason: reason, StopLead: v.stopLead})
		d.requeueAt(d.now.Add(LeaveGrace(d.spec)))
	}
}

// countFailure counts a failure of pod v, once per pass, attributed to its
// deletion (Deletion.Failures).
func (d *decision) countFailure(v *podView) { d.count(v, true) }

// countPreemption counts a preemption of pod v, once per pass, attributed
// to its deletion (Deletion.Preemptions).
func (d *decision) countPreemption(v *podView) { d.count(v, false) }

func (d *decision) count(v *podView, failure bool) {
	c := d.counted[v.pod.Name]
	n, total := &c.Preemptions, &d.preemptions
	if failure {
		n, total = &c.Failures, &d.failures
	}
	if *n > 0 {
		return
	}
	*n, *total = 1, *total+1
	d.counted[v.pod.Name] = c
}

// requeueAt asks Decide to look again at t, keeping the earliest deadline.
func (d *decision) requeueAt(t time.Time) {
	after := t.Sub(d.now)
	if after <= 0 {
		after = time.Millisecond
	}
	if d.requeue == 0 || after < d.requeue {
		d.requeue = after
	}
}

// event adds a Kubernetes Event to the plan.
func (d *decision) event(warning bool, reason etjobv1.EventReason, msg string) {
	d.events = append(d.events, Event{Warning: warning, Reason: reason, Message: msg})
}

// record adds a timeline entry; build stamps it with the pass's membership
// (stampTimeline).
func (d *decision) record(kind, msg string) {
	d.timeline = append(d.timeline, etjobv1.TimelineEvent{Time: metav1.Time{Time: d.now}, Type: kind, Message: msg})
}

// setCondition sets a status condition (its reason defaults to its type).
func (d *decision) setCondition(t string, status bool, reason, msg string) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	if reason == "" {
		reason = t
	}
	meta.SetStatusCondition(&d.conds, metav1.Condition{
		Type: t, Status: s, Reason: reason, Message: msg,
		ObservedGeneration: d.job.Generation, LastTransitionTime: metav1.Time{Time: d.now},
	})
}
