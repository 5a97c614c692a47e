package core

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// The price limit (spec.spot.maxPricePerHour): new workers are kept off nodes
// priced above it (Plan.AvoidNodes), and a worker whose node's price rose
// above it leaves at an agreed step, a release like a scale-in, and is
// replaced elsewhere. A node's price is its etjob.dev/price-per-hour label,
// which a price source keeps up to date (the local cluster's emulated
// clouds, or a cloud's price feed). A worker training through a notice
// keeps its stop time when its node's price rises: the node goes within the
// notice anyway, and its replacement was created at the notice.

// MaxPrice is spec.spot.maxPricePerHour; ok is false when unset or invalid
// (the CRD's pattern refuses an invalid one).
func MaxPrice(spec *etjobv1.ElasticJobSpec) (p etjobv1.PricePerHour, ok bool) {
	if spec.Spot == nil || spec.Spot.MaxPricePerHour == "" {
		return 0, false
	}
	p, err := etjobv1.ParsePricePerHour(spec.Spot.MaxPricePerHour)
	return p, err == nil
}

// OverPrice reports whether node's price is above the job's
// spec.spot.maxPricePerHour, and its price: the one rule, which the
// controller also uses to choose the nodes it adds to the snapshot.
func OverPrice(spec *etjobv1.ElasticJobSpec, node *corev1.Node) (etjobv1.PricePerHour, bool) {
	limit, ok := MaxPrice(spec)
	if !ok || node == nil {
		return 0, false
	}
	p, ok := etjobv1.NodePrice(node)
	return p, ok && p > limit
}

// overPrice is OverPrice for a node of the snapshot, by name.
func (d *decision) overPrice(nodeName string) (etjobv1.PricePerHour, bool) {
	return OverPrice(d.spec, d.s.Nodes[nodeName])
}

// leaveOverPrice tells the workers on nodes priced above the limit to leave.
func (d *decision) leaveOverPrice() {
	if _, ok := MaxPrice(d.spec); !ok {
		return
	}
	for _, w := range d.workers {
		if !w.scheduled || !w.active() || d.deleted[w.pod.Name] {
			continue
		}
		p, over := d.overPrice(w.pod.Spec.NodeName)
		if !over {
			continue
		}
		w.leaveAt, w.leaveReason = d.now, etjobv1.ReasonPriceAboveMax
		d.signal(w, etjobv1.ReasonPriceAboveMax)
		d.record(etjobv1.TimelineLeave, fmt.Sprintf("%s leaves: node %s costs %s an hour, above spec.spot.maxPricePerHour %s",
			w.pod.Name, w.pod.Spec.NodeName, p, d.spec.Spot.MaxPricePerHour))
	}
}

// avoidNodes are the nodes priced above the limit, by name: new workers are
// kept off them.
func (d *decision) avoidNodes() []string {
	if _, ok := MaxPrice(d.spec); !ok {
		return nil
	}
	var out []string
	for name := range d.s.Nodes {
		if _, over := d.overPrice(name); over {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}
