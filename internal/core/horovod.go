package core

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Horovod's rule for membership changes. horovodrun moves the training state
// to new ranks by a broadcast from a rank that has it, so every change of its
// host set must keep at least one host of the set before it: when none
// remains it raises "No hosts from previous set remaining, unable to
// broadcast state" (horovod/runner/elastic/driver.py,
// _update_host_assignments), then "failed to activate new hosts -> stop
// running", and exits non-zero. etjob keeps such a change from reaching it:
//
//   - a member training through its notice carries the state: joiners that
//     would replace only such members join at once, beside them, when their
//     stop is at least HorovodHandover away (batchJoiners), so the new ranks
//     hold the state before the old ones leave discovery;
//   - otherwise (every member leaves, or is lost, while others are ready to
//     join) the joiners are not published: every remaining rank is told to
//     stop at the step they agree on, and horovodrun is marked as stopped by
//     etjob (horovodHandover), so that its exit is a release; once no rank
//     of it is left it is released at once (releaseStoppedLauncher) and a
//     new horovodrun resumes from the stop's checkpoint with the new set;
//   - a horovodrun marked stopped is never given a new host.

// HorovodHandover is how long before the last member that carries a horovod
// job's state stops training the joiners that take over from it must be
// published: Horovod reads discovery every second and resets at the next
// commit, then broadcasts the state (seconds for a GB model). Joiners that
// would come later are held, and the job stops at an agreed step instead.
const HorovodHandover = 15 * time.Second

// horovodLauncherLive reports whether a horovod job's horovodrun is running:
// its pod exists, is not finished, going or lost, and its node has no notice
// (a noticed launcher moves: moveLauncher).
func (d *decision) horovodLauncherLive() bool {
	l := d.launcher
	return d.spec.Framework == etjobv1.FrameworkHorovod && l != nil &&
		!l.terminal && !l.deleting && !l.lost && !l.noticed && !d.deleted[l.pod.Name]
}

// launcherStopped reports whether etjob told the launcher that its training
// stops (this pass or an earlier one): its exit is then a release.
func (d *decision) launcherStopped() bool {
	l := d.launcher
	return l != nil && (d.signaled[l.pod.Name] || (!l.leaveAt.IsZero() && isRelease(l.leaveReason)))
}

// handoverVerdict is Horovod's rule's outcome for a pass (judgeHandover):
// whether only the members of the published set stay members (the others
// wait for the next horovodrun), and whether the job stops for want of a
// host that carries the state: the workers to tell, with the launcher, and
// why, and how many joiners wait for the next horovodrun.
type handoverVerdict struct {
	keepPublished bool
	stop          bool
	reason        string
	tell          []*podView
	joiners       int
}

// judgeHandover is Horovod's rule as a function of the published set
// (prev), the members elected this pass, the workers, whether etjob already
// stopped the running horovodrun, and which workers this pass already
// deleted or told (told).
func judgeHandover(prev map[string]bool, members, workers []*podView, stopped bool, told func(*podView) bool) handoverVerdict {
	if stopped {
		return handoverVerdict{keepPublished: true}
	}
	carried := false
	for _, w := range members {
		carried = carried || prev[w.pod.Name]
	}
	if len(prev) == 0 || carried {
		return handoverVerdict{}
	}
	// No member of the published set stays: this horovodrun cannot go on.
	// With no joiner either the job is below minReplicas (stopBelowMin
	// says so); with joiners it stops for them.
	v := handoverVerdict{keepPublished: true, stop: true, reason: etjobv1.ReasonWaitingForCapacity, joiners: len(members)}
	if v.joiners > 0 {
		v.reason = etjobv1.ReasonStateHandover
	}
	for _, w := range workers {
		if prev[w.pod.Name] && !w.terminal && !w.deleting && !w.lost && w.leaveAt.IsZero() && !told(w) {
			v.tell = append(v.tell, w)
		}
	}
	return v
}

// horovodHandover applies Horovod's rule (judgeHandover) to the members
// elect computed: a running horovodrun is never given a host set that
// shares no host with the one it has, nor a new host once etjob stopped it.
// A change that would leave no host of the published set stops the job
// instead: the remaining ranks are told to stop at an agreed step (their
// checkpoint is what the next horovodrun resumes from) and the launcher is
// marked, and the joiners wait for that next horovodrun.
func (d *decision) horovodHandover() {
	if !d.horovodLauncherLive() {
		return
	}
	prev := map[string]bool{}
	for _, h := range d.s.Job.Status.Membership.Hosts {
		prev[HostName(h)] = true
	}
	v := judgeHandover(prev, d.members, d.workers, d.launcherStopped(), func(w *podView) bool {
		return d.deleted[w.pod.Name] || d.signaled[w.pod.Name]
	})
	if v.stop {
		for _, w := range v.tell {
			d.signal(w, v.reason)
		}
		d.signal(d.launcher, v.reason)
	}
	if v.keepPublished {
		d.keepPublished(prev)
	}
	if v.stop && v.joiners > 0 {
		msg := fmt.Sprintf("no member of horovodrun's host set stays while %d workers are ready to join, so it cannot broadcast the state to them: "+
			"the job stops at an agreed step and a new horovodrun resumes from its checkpoint with them", v.joiners)
		if len(v.tell) > 0 {
			msg += fmt.Sprintf(" (%d more workers told to stop)", len(v.tell))
		}
		d.record(etjobv1.TimelineStop, msg)
		d.event(false, etjobv1.EventStateHandover, msg)
	}
}

// keepPublished keeps only the members that are in the published set.
// The others wait for the next horovodrun: stopBelowMin leaves them be.
func (d *decision) keepPublished(prev map[string]bool) {
	kept := d.members[:0]
	for _, w := range d.members {
		if prev[w.pod.Name] {
			kept = append(kept, w)
		} else {
			d.heldForHandover[w.pod.Name] = true
		}
	}
	d.members = kept
}

// horovodRanksGone reports whether no rank of the job's horovodrun can still
// train: every host of the published membership is a worker that is gone,
// finished, lost or leaving (told, or on a noticed node), and there is
// one (a launcher exists only once members were published). horovodrun then
// ends because its ranks left or were taken, which is etjob's stop or a
// preemption, never the job's failure.
func (d *decision) horovodRanksGone() bool {
	if len(d.s.Job.Status.Membership.Hosts) == 0 {
		return false
	}
	byName := map[string]*podView{}
	for _, w := range d.workers {
		byName[w.pod.Name] = w
	}
	for _, h := range d.s.Job.Status.Membership.Hosts {
		w := byName[HostName(h)]
		if w != nil && !w.terminal && !w.deleting && !w.lost && !w.leaving() {
			return false
		}
	}
	return true
}

// horovodRankLeaving reports whether a rank of horovodrun's set was told to
// stop or is on a noticed node. A rank of that set that horovodrun then names
// as the first to fail, killed (128 and up, 255 when its exec's connection
// went with its node) or preempted (75), was taken with the stop under way:
// its node's loss is often not seen yet when horovodrun stops on "failure
// count == N" (every rank of its round non-zero), so its exit is a release.
func (d *decision) horovodRankLeaving() bool {
	published := map[string]bool{}
	for _, h := range d.s.Job.Status.Membership.Hosts {
		published[HostName(h)] = true
	}
	for _, w := range d.workers {
		if published[w.pod.Name] && w.leaving() {
			return true
		}
	}
	return false
}

// noPreviousHost reports whether a launcher's termination message is
// horovodrun's own for a change that kept no host of its set.
func noPreviousHost(message string) bool {
	return strings.Contains(message, "No hosts from previous set remaining")
}

// releaseStoppedLauncher releases a horovodrun that etjob stopped once no
// rank of it is left (every worker told to stop has gone): it would
// otherwise wait for hosts up to its --elastic-timeout (600 s), and no new
// host can join it. It reports whether it did.
func (d *decision) releaseStoppedLauncher() bool {
	if !d.horovodLauncherLive() || !d.launcherStopped() || len(d.s.Job.Status.Membership.Hosts) > 0 {
		return false
	}
	for _, w := range d.workers {
		if !w.leaveAt.IsZero() && !w.terminal && !w.deleting && !w.lost && !d.deleted[w.pod.Name] {
			return false // a rank may still be writing the stop's checkpoint
		}
	}
	return true
}

// horovodExitReleased reports whether a finished horovodrun ended because of
// etjob's stop, a change that left it no host, or the loss of every rank
// (releaseLauncher), not because of the job: etjob marked it stopped, the
// job waits below minReplicas, every rank of its set left or was lost, or
// its message is its own for a change that kept no host. Any other exit
// still counts, and so does one whose message names, as the first rank that
// failed, a rank on a worker that was neither told to go nor lost (that rank
// failed on its own), or one that could not run its command (126, 127). A
// first failed rank that was killed or preempted while another rank of the
// set was leaving is a release too (horovodRankLeaving).
func (d *decision) horovodExitReleased(l *podView) bool {
	if l.exitCode == 126 || l.exitCode == 127 {
		return false
	}
	host, code, ok := firstFailedRank(l.message)
	taken := ok && (code == etjobv1.ExitCodePreempted || code >= 128)
	if !l.released && !d.horovodStopped() && !d.horovodRanksGone() && !noPreviousHost(l.message) &&
		!(taken && d.horovodRankLeaving()) {
		return false
	}
	if !ok || taken {
		return true
	}
	for _, w := range d.workers {
		if w.pod.Name == host {
			return w.leaving() || w.lost || w.deleting || w.preempted || w.released
		}
	}
	return true // its worker is gone
}

// failedRankLine finds the first failed rank in horovodrun's message:
// "The first process to do so was:\nProcess name: HOST[SLOT]\nExit code: N"
// (horovod/runner/gloo_run.py).
var failedRankLine = regexp.MustCompile(`Process name: (\S+)\[\d+\]\s+Exit code: (-?\d+)`)

// firstFailedRank returns the host and exit code of the first rank that
// failed, as horovodrun's message names it.
func firstFailedRank(message string) (host string, code int32, ok bool) {
	m := failedRankLine.FindStringSubmatch(message)
	if m == nil {
		return "", 0, false
	}
	n, err := strconv.ParseInt(m[2], 10, 32)
	if err != nil {
		return "", 0, false
	}
	return m[1], int32(n), true
}
