package core

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// elect computes the membership this pass publishes: ready workers that are
// not leaving, and workers on a noticed node until their stop time, by index,
// at most maxReplicas, less the joiners batchJoiners holds back and the
// workers horovodHandover keeps for the next horovodrun. It writes no status:
// publish does, once a pass. A pass elects again after a step that told
// members to go (see run).
func (d *decision) elect() {
	slots := etjobv1.SlotsPerWorker(d.spec)
	d.members = d.members[:0]
	for _, w := range d.workers {
		staying := w.ready && w.active() && !d.deleted[w.pod.Name] && !d.signaled[w.pod.Name]
		if staying || d.trainsThroughNotice(w) {
			d.members = append(d.members, w)
		}
	}
	if len(d.members) > int(d.spec.MaxReplicas) {
		d.members = d.members[:d.spec.MaxReplicas]
	}
	d.batchJoiners()
	d.horovodHandover()
	hosts := make([]string, 0, len(d.members))
	for _, w := range d.members {
		hosts = append(hosts, FormatHost(w.pod.Name, slots))
	}
	d.hosts = &hosts
}

// clearMembers ends the membership: the job's training ended (it finished,
// restarts or is suspended); publish writes it empty.
func (d *decision) clearMembers() {
	d.members = nil
	d.hosts = &[]string{}
}

// publish makes the membership this pass elected (or cleared) the one the
// status carries (build writes it); a pass that did neither keeps the
// published one. A change bumps the generation, which never goes back.
func (d *decision) publish() {
	if d.hosts != nil {
		d.setHosts(*d.hosts)
	}
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
	if last := d.lastCarrierStop(staying); !last.IsZero() {
		// Horovod: only members training through their notices carry the
		// state (horovod.go). Joiners that come at least HorovodHandover
		// before the last of them stops join at once, beside them, and
		// take the state from them; later ones wait, and the job stops at
		// an agreed step when the carriers go (horovodHandover).
		if last.Sub(d.now) >= HorovodHandover {
			return
		}
		d.hold(staying, joining, last)
		return
	}
	if stop := d.nextNoticeStop(staying); !stop.IsZero() && stop.Sub(d.now) <= NoticeJoinHold {
		// A member trains through its notice and stops soon: the joiners
		// take its place in the same membership change, one restart
		// instead of two.
		d.hold(staying, joining, stop)
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
	d.hold(staying, joining, first.Add(JoinBatchWindow))
}

// hold publishes the staying members without the joiners until until.
func (d *decision) hold(staying, joining []*podView, until time.Time) {
	d.members = staying
	d.joining = map[string]bool{}
	for _, w := range joining {
		d.joining[w.pod.Name] = true
	}
	d.requeueAt(until)
}

// lastCarrierStop is, for a horovod job whose staying members all train
// through their notices, the latest of their stop times: when the last
// member that can hand horovodrun's state to joiners stops. It is zero for
// other jobs, or when a staying member trains on with no notice.
func (d *decision) lastCarrierStop(staying []*podView) time.Time {
	if d.spec.Framework != etjobv1.FrameworkHorovod {
		return time.Time{}
	}
	var last time.Time
	for _, w := range staying {
		at := stopAt(w)
		if !d.trainsThroughNotice(w) {
			return time.Time{}
		}
		if at.After(last) {
			last = at
		}
	}
	return last
}

// nextNoticeStop is the earliest stop time of the members that train
// through a notice (zero if none does).
func (d *decision) nextNoticeStop(members []*podView) time.Time {
	var next time.Time
	for _, w := range members {
		if at := stopAt(w); d.trainsThroughNotice(w) && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}

// setHosts sets the membership to hosts: the generation is the last
// published one plus one if the hosts differ from it.
func (d *decision) setHosts(hosts []string) {
	orig := d.s.Job.Status.Membership
	if slices.Equal(orig.Hosts, hosts) {
		d.membership = *orig.DeepCopy()
		return
	}
	if len(hosts) == 0 {
		hosts = nil
	}
	d.membership = etjobv1.MembershipStatus{Generation: orig.Generation + 1, Hosts: hosts, ChangeTime: &metav1.Time{Time: d.now}}
}

// recordMembership adds a timeline entry and an Event when this pass changed
// the membership (build puts the new one in the plan).
func (d *decision) recordMembership() {
	orig, m := d.s.Job.Status.Membership, d.membership
	if m.Generation == orig.Generation {
		return
	}
	joined, left := diff(orig.Hosts, m.Hosts)
	switch {
	case len(joined) > 0 && len(left) == 0:
		d.record(etjobv1.TimelineJoin, "joined: "+strings.Join(joined, ", "))
	case len(left) > 0 && len(joined) == 0:
		d.record(etjobv1.TimelineLeave, "left: "+strings.Join(left, ", "))
	default:
		d.record(etjobv1.TimelineChange, fmt.Sprintf("joined: %s; left: %s", strings.Join(joined, ", "), strings.Join(left, ", ")))
	}
	d.event(false, etjobv1.EventMembershipChanged, fmt.Sprintf("generation %d: %d members", m.Generation, len(m.Hosts)))
}

// diff returns the names of the hosts that joined and that left between two
// memberships.
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
