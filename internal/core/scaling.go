package core

import (
	"fmt"
	"slices"
	"sort"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

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

// desired is spec.replicas within [minReplicas, maxReplicas].
func (d *decision) desired() int32 {
	return max(d.spec.MinReplicas, min(d.spec.Replicas, d.spec.MaxReplicas))
}
