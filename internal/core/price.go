package core

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Prices. A node's price (NodePrice) is its etjob.dev/price-per-hour
// annotation, else its label of that name (a price source keeps them up to
// date: the local cluster's emulated clouds, or a cloud's price feed), held
// against the platform admin's price table where one is kept (a node may only
// raise its row's price; a node the table does not list costs its dearest). Two
// policies use it:
//   - the price limit (spec.spot.maxPricePerHour): new workers are kept off
//     nodes priced above it (Plan.AvoidNodes), and a worker whose node's
//     price rose above it leaves at an agreed step, a release like a
//     scale-in, and is replaced elsewhere. A worker training through a
//     notice keeps its stop time when its node's price rises: the node goes
//     within the notice anyway, and its replacement was created at the
//     notice;
//   - the budget (spec.spot.budgetPerHour): while the workers cost more, the
//     dearest leave (leaveOverBudget), and new workers are kept off nodes
//     dearer than their share of what is left (budgetAvoid).

// MaxPrice is spec.spot.maxPricePerHour; ok is false when unset or invalid
// (the CRD's pattern refuses an invalid one).
func MaxPrice(spec *etjobv1.ElasticJobSpec) (p etjobv1.PricePerHour, ok bool) {
	if spec.Spot == nil || spec.Spot.MaxPricePerHour == "" {
		return 0, false
	}
	p, err := etjobv1.ParsePricePerHour(spec.Spot.MaxPricePerHour)
	return p, err == nil
}

// NodePrice is node's price under the admin's price table (issue #26, N7).
// With no table (nil): the node's own (etjobv1.NodePrice; ok is false when
// it has none). With one, the node's own price (its etjob.dev/price-per-hour,
// which its agent writes and a rooted node can forge) only proposes: it may
// raise its row's price (a spot market that rose), never lower it; a node
// whose instance type and capacity type the table does not list costs the
// table's dearest (ok is then always true). The row is found by the
// kubelet's labels, or, with the table's KeyLabelPrefix (issue #42, H2), by
// the admin's, which a kubelet cannot set: then a rooted node cannot pass
// for a cheaper instance type either. A rooted node can then only make
// itself look dearer, which draws no budget job's workers to it. A table
// without rows, which stands for one --price-table-required wants and cannot
// read (issue #42, M5), prices no node: ok is false, the node's own claim
// not believed.
func NodePrice(prices *etjobv1.PriceTable, node *corev1.Node) (etjobv1.PricePerHour, bool) {
	own, ok := etjobv1.NodePrice(node)
	if prices == nil {
		return own, ok
	}
	if len(prices.Prices) == 0 { // required and absent (M5): nothing is priced
		return 0, false
	}
	row, listed := prices.RowOf(node.Labels)
	if !listed {
		return prices.Dearest(), true
	}
	return max(row, own), true
}

// OverPrice reports whether node's price is above the job's
// spec.spot.maxPricePerHour, and its price: the one rule, which
// SnapshotNode also applies when the controller chooses the nodes it adds to
// the snapshot.
func OverPrice(spec *etjobv1.ElasticJobSpec, prices *etjobv1.PriceTable, node *corev1.Node) (etjobv1.PricePerHour, bool) {
	limit, ok := MaxPrice(spec)
	if !ok || node == nil {
		return 0, false
	}
	p, ok := NodePrice(prices, node)
	return p, ok && p > limit
}

// overPrice is OverPrice for a node of the snapshot, by name.
func (d *decision) overPrice(nodeName string) (etjobv1.PricePerHour, bool) {
	return OverPrice(d.spec, d.s.Prices, d.s.Nodes[nodeName])
}

// priced is a worker that a price policy tells to leave: its node's price,
// and for the budget what the workers cost before it left.
type priced struct {
	w     *podView
	price etjobv1.PricePerHour
	was   etjobv1.PricePerHour
}

// overPriceLeavers is the price limit as a function: the scheduled, active
// workers not already gone whose node over says is priced above the limit.
func overPriceLeavers(workers []*podView, gone map[string]bool, over func(node string) (etjobv1.PricePerHour, bool)) []priced {
	var out []priced
	for _, w := range workers {
		if !w.scheduled || !w.active() || gone[w.pod.Name] {
			continue
		}
		if p, ok := over(w.pod.Spec.NodeName); ok {
			out = append(out, priced{w: w, price: p})
		}
	}
	return out
}

// leaveOverPrice tells the workers on nodes priced above the limit to leave.
func (d *decision) leaveOverPrice() {
	if _, ok := MaxPrice(d.spec); !ok {
		return
	}
	for _, l := range overPriceLeavers(d.workers, d.deleted, d.overPrice) {
		w := l.w
		w.leaveAt, w.leaveReason = d.now, etjobv1.ReasonPriceAboveMax
		d.signal(w, etjobv1.ReasonPriceAboveMax)
		d.record(etjobv1.TimelineLeave, fmt.Sprintf("%s leaves: node %s costs %s an hour, above spec.spot.maxPricePerHour %s",
			w.pod.Name, w.pod.Spec.NodeName, l.price, d.spec.Spot.MaxPricePerHour))
	}
}

// avoidNodes are the nodes new workers are kept off, by name: those priced
// above the limit, and those dearer than a new worker's share of the budget
// left (budgetAvoid).
func (d *decision) avoidNodes(left etjobv1.PricePerHour) []string {
	out := d.budgetAvoid(left)
	if _, ok := MaxPrice(d.spec); ok {
		for name := range d.s.Nodes {
			if _, over := d.overPrice(name); over {
				out = append(out, name)
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// The budget (spec.spot.budgetPerHour) bounds what the job's workers cost
// together an hour. Its spend is the price of the nodes of its active,
// scheduled workers (a leaving worker is going and not counted; a node
// without a price costs 0). New workers are not started above it: a pass
// creates at most as many as the budget left buys at the cheapest priced
// node, counting the workers still unscheduled, and keeps each off the nodes
// dearer than its share of what is left (Plan.AvoidNodes), so no single
// placement can overrun it. Prices that rise above it make the dearest
// workers leave at an agreed step, a release, until the spend fits again.

// BudgetRecheck is how often a job that its budget holds below its size
// looks at the prices again.
const BudgetRecheck = 30 * time.Second

// Budget is spec.spot.budgetPerHour; ok is false when unset or invalid (the
// CRD's pattern refuses an invalid one).
func Budget(spec *etjobv1.ElasticJobSpec) (b etjobv1.PricePerHour, ok bool) {
	if spec.Spot == nil || spec.Spot.BudgetPerHour == "" {
		return 0, false
	}
	b, err := etjobv1.ParsePricePerHour(spec.Spot.BudgetPerHour)
	return b, err == nil
}

// ObservesPrices reports whether Decide needs every priced node of the
// cluster in the snapshot, not only those of the job's pods: to keep new
// workers off dearer nodes (a price limit or a budget) and, for a budget, to
// know the cheapest.
func ObservesPrices(spec *etjobv1.ElasticJobSpec) bool {
	_, limit := MaxPrice(spec)
	_, budget := Budget(spec)
	return limit || budget
}

// SnapshotNode reports whether the controller puts node in the snapshot of a
// job that ObservesPrices although none of the job's pods is on it: a node
// priced above the limit (kept off), and for a budget any priced node (the
// cheapest bounds the count; dearer ones are kept off).
func SnapshotNode(spec *etjobv1.ElasticJobSpec, prices *etjobv1.PriceTable, node *corev1.Node) bool {
	if _, over := OverPrice(spec, prices, node); over {
		return true
	}
	_, budget := Budget(spec)
	_, priced := NodePrice(prices, node)
	return budget && priced
}

// nodePrice is the price of a node of the snapshot, 0 when unknown.
func (d *decision) nodePrice(name string) etjobv1.PricePerHour {
	if n := d.s.Nodes[name]; n != nil {
		if p, ok := NodePrice(d.s.Prices, n); ok {
			return p
		}
	}
	return 0
}

// staying are the workers the budget pays for: active and scheduled.
func (d *decision) staying() []*podView {
	var out []*podView
	for _, w := range d.workers {
		if w.scheduled && w.active() && !d.deleted[w.pod.Name] {
			out = append(out, w)
		}
	}
	return out
}

// unscheduled counts the active workers not bound to a node yet.
func (d *decision) unscheduled() int {
	n := 0
	for _, w := range d.workers {
		if !w.scheduled && w.active() && !d.deleted[w.pod.Name] {
			n++
		}
	}
	return n
}

// spend is what the staying workers cost an hour.
func (d *decision) spend() etjobv1.PricePerHour {
	var s etjobv1.PricePerHour
	for _, w := range d.staying() {
		s += d.nodePrice(w.pod.Spec.NodeName)
	}
	return s
}

// overBudgetLeavers is the budget as a function: while what the staying
// workers cost an hour (price of each one's node) is above budget, the
// dearest leave, at equal prices extra workers first, then the highest
// index; a worker on an unpriced node never leaves for the budget.
func overBudgetLeavers(budget etjobv1.PricePerHour, staying []*podView, price func(node string) etjobv1.PricePerHour) []priced {
	var spend etjobv1.PricePerHour
	for _, w := range staying {
		spend += price(w.pod.Spec.NodeName)
	}
	if spend <= budget {
		return nil
	}
	ws := slices.Clone(staying)
	sort.SliceStable(ws, func(i, j int) bool {
		pi, pj := price(ws[i].pod.Spec.NodeName), price(ws[j].pod.Spec.NodeName)
		if pi != pj {
			return pi > pj
		}
		if ws[i].extra != ws[j].extra {
			return ws[i].extra
		}
		return ws[i].index > ws[j].index
	})
	var out []priced
	for _, w := range ws {
		if spend <= budget {
			break
		}
		p := price(w.pod.Spec.NodeName)
		if p <= 0 {
			break
		}
		out = append(out, priced{w: w, price: p, was: spend})
		spend -= p
	}
	return out
}

// leaveOverBudget tells the dearest workers to leave while the job's spend is
// above its budget (overBudgetLeavers).
func (d *decision) leaveOverBudget() {
	budget, ok := Budget(d.spec)
	if !ok {
		return
	}
	for _, l := range overBudgetLeavers(budget, d.staying(), d.nodePrice) {
		w := l.w
		w.leaveAt, w.leaveReason = d.now, etjobv1.ReasonOverBudget
		d.signal(w, etjobv1.ReasonOverBudget)
		d.record(etjobv1.TimelineLeave, fmt.Sprintf("%s leaves: the workers cost %s an hour, above spec.spot.budgetPerHour %s (node %s: %s)",
			w.pod.Name, l.was, d.spec.Spot.BudgetPerHour, w.pod.Spec.NodeName, l.price))
	}
}

// budgetRoom is how many new workers the budget lets this pass create
// (math.MaxInt32 without a budget), and the budget left once the staying
// workers are paid for.
func (d *decision) budgetRoom() (room int32, left etjobv1.PricePerHour) {
	budget, ok := Budget(d.spec)
	if !ok {
		return math.MaxInt32, 0
	}
	left = budget - d.spend()
	cheapest, found := d.cheapestNode()
	if left <= 0 {
		return 0, left
	}
	if !found {
		// No node carries a price: nothing to bound the count with; each
		// new worker's share still keeps it off dearer nodes.
		return math.MaxInt32, left
	}
	return max(int32(math.Floor(float64(left/cheapest)+1e-9))-int32(d.unscheduled()), 0), left
}

// cheapestNode is the lowest price of a ready, unnoticed node that carries
// one.
func (d *decision) cheapestNode() (etjobv1.PricePerHour, bool) {
	var cheapest etjobv1.PricePerHour
	found := false
	for _, n := range d.s.Nodes {
		p, ok := NodePrice(d.s.Prices, n)
		if !ok || p <= 0 || !NodeReady(n) || n.Annotations[etjobv1.AnnotationNodeNotice] != "" {
			continue
		}
		if _, over := OverPrice(d.spec, d.s.Prices, n); over {
			continue
		}
		if !found || p < cheapest {
			cheapest, found = p, true
		}
	}
	return cheapest, found
}

// NodeReady reports whether the node's Ready condition is True: the one
// test of a node's readiness (the core's, the local cluster's).
func NodeReady(n *corev1.Node) bool {
	c := NodeReadyCondition(n)
	return c != nil && c.Status == corev1.ConditionTrue
}

// NodeReadyCondition is the node's Ready condition, nil when it has none.
// Its status and transition time are what the core reads of it (a pod on a
// node NotReady since then: notReadySince), so the controller's node watch
// compares both.
func NodeReadyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// budgetAvoid are the nodes dearer than a new worker's share of the budget
// left, by name: left split evenly among the workers still unscheduled and
// those this pass creates (nil without a budget).
func (d *decision) budgetAvoid(left etjobv1.PricePerHour) []string {
	if _, ok := Budget(d.spec); !ok {
		return nil
	}
	n := len(d.created) + d.unscheduled()
	share := left / etjobv1.PricePerHour(max(n, 1))
	var out []string
	for name, node := range d.s.Nodes {
		if p, ok := NodePrice(d.s.Prices, node); ok && p > share {
			out = append(out, name)
		}
	}
	return out
}
