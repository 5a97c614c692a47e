package core

import (
	"fmt"
	"slices"
	"sort"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// scale brings the number of active workers to the desired size: new workers
// up to desired (never above maxReplicas pods alive, bounded per pass), and on a
// scale-in the named workers, then the highest indices, told to leave. Under
// spec.growth's Opportunistic policy (growth.go) it also adds extra workers
// above desired, and gives them back first.
func (d *decision) scale() {
	desired := d.desired()
	var base, extra []*podView
	alive := 0
	for _, w := range d.workers {
		if d.deleted[w.pod.Name] || w.deleting || w.terminal {
			continue
		}
		alive++
		switch {
		case !w.active():
		case w.extra:
			extra = append(extra, w)
		default:
			base = append(base, w)
		}
	}
	g := d.growthRoom(desired, base, extra)
	extra = slices.DeleteFunc(extra, func(w *podView) bool { return d.deleted[w.pod.Name] })
	if n := len(extra) - int(g.room); n > 0 {
		d.giveBack(extra, n)
		extra = extra[:len(extra)-n]
	}
	if d.growth != nil {
		d.growth.ExtraWorkers = int32(len(extra))
	}
	if victims := scaleInVictims(base, desired); len(victims) > 0 {
		for _, v := range victims {
			d.release(v, etjobv1.ReasonScaleIn)
		}
		d.record(etjobv1.TimelineScale, fmt.Sprintf("scale in to %d workers", desired))
		return
	}
	if d.restarting {
		return
	}
	budget, left := d.budgetRoom()
	n, want := createCount(desired, len(base), alive, d.spec.MaxReplicas, budget)
	d.create(n, false)
	if budget < want && budget < MaxCreatesPerPass {
		d.budgetShort, d.budgetLeft = want-max(n, 0), left
		// A cheaper node that comes up hosts none of the job's pods, so no
		// watch event brings the job back: look again.
		d.requeueAt(d.now.Add(BudgetRecheck))
	}
	if g.probe {
		k := min(g.room-int32(len(extra)), MaxCreatesPerPass-int32(len(d.created)), d.spec.MaxReplicas-int32(alive)-int32(len(d.created)),
			budget-int32(len(d.created)))
		if d.create(k, true) > 0 {
			d.growthStatus().ExtraWorkers += k
			d.record(etjobv1.TimelineScale, fmt.Sprintf("probe for capacity with %d extra workers (growth up to %d)", k, desired+g.room))
		}
	}
	if len(d.created) > 0 {
		d.avoid = d.avoidNodes(left)
	}
}

// scaleInVictims is the scale-in as a function: the base workers above
// desired that leave, those named by a ScaleIn request first, then the
// highest indices; nil when none is above.
func scaleInVictims(base []*podView, desired int32) []*podView {
	n := int32(len(base)) - desired
	if n <= 0 {
		return nil
	}
	victims := slices.Clone(base)
	sort.SliceStable(victims, func(i, j int) bool {
		if victims[i].scaleIn != victims[j].scaleIn {
			return victims[i].scaleIn
		}
		return victims[i].index > victims[j].index
	})
	return victims[:n]
}

// createCount is how many base workers a pass creates (n) toward desired
// from base active ones, with alive pods of at most maxReplicas, at most
// MaxCreatesPerPass, and no more than the budget buys; want is what it would
// create without the budget.
func createCount(desired int32, base, alive int, maxReplicas, budget int32) (n, want int32) {
	want = min(desired-int32(base), maxReplicas-int32(alive))
	return min(want, MaxCreatesPerPass, budget), want
}

// create adds n new workers (extra ones above spec.replicas) to the plan and
// returns how many.
func (d *decision) create(n int32, extra bool) int32 {
	for range max(n, 0) {
		d.created = append(d.created, d.nextIndex)
		if extra {
			d.extra = append(d.extra, d.nextIndex)
		}
		d.nextIndex++
	}
	return max(n, 0)
}

// giveBack lets n extra workers go: the unscheduled ones first, then the
// highest indices.
func (d *decision) giveBack(extra []*podView, n int) {
	for _, v := range givenBack(extra, n) {
		d.release(v, etjobv1.ReasonGrowth)
	}
	d.record(etjobv1.TimelineScale, fmt.Sprintf("give back %d extra workers", n))
}

// givenBack are the n extra workers to let go: the unscheduled ones first,
// then the highest indices. It sorts extra so, scheduled and low indices
// first: the caller keeps extra[:len(extra)-n].
func givenBack(extra []*podView, n int) []*podView {
	sort.SliceStable(extra, func(i, j int) bool {
		if extra[i].scheduled != extra[j].scheduled {
			return extra[i].scheduled
		}
		return extra[i].index < extra[j].index
	})
	return extra[len(extra)-n:]
}

// release tells a ready worker to leave at an agreed step and deletes one
// that is not ready yet.
func (d *decision) release(v *podView, reason string) {
	if v.ready {
		d.signal(v, reason)
	} else {
		d.delete(v, reason)
	}
}

// desired is spec.replicas within [minReplicas, maxReplicas].
func (d *decision) desired() int32 {
	return max(d.spec.MinReplicas, min(d.spec.Replicas, d.spec.MaxReplicas))
}
