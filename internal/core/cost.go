package core

import (
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// CostFlushInterval: the bill (status.cost) is brought up to date with every
// status write, and at least this often while a worker runs, so a running
// job costs one status write in this interval and the bill shown lags at
// most this much.
const CostFlushInterval = 5 * time.Minute

// costKey is one row of the bill.
type costKey struct {
	capacity, instance, price, onDemand string
}

// bill is status.cost for the status st that the pass writes, and when to
// look again (zero for none). It brings the bill up to now when st differs
// from the observed status anyway or the bill is CostFlushInterval old:
// every worker pod (any attempt) adds the time since the bill's last update
// that it ran, from its start (status.startTime) to its container's end, or
// to now while it runs, at its node's capacity type and price. A pod deleted between two updates loses
// its time since the last one, which is why the bill follows every status
// write: a worker's end (terminal, deleting, leaving) changes the status.
// A pod on a node that is gone adds nothing more (its price went with it).
// It reads every pod observed (d.pods), not d.workers, which a restart
// empties: a restart's pass once billed none of the workers it deleted.
func (d *decision) bill(st etjobv1.ElasticJobStatus) (cost *etjobv1.CostStatus, recheck time.Time) {
	prev := d.s.Job.Status.Cost
	var from time.Time
	if prev != nil && prev.Time != nil {
		from = prev.Time.Time
	}
	running := false
	for _, v := range d.pods {
		if v.role == etjobv1.RoleWorker && v.pod.Status.StartTime != nil && !v.terminal && !v.lost {
			running = true
		}
	}
	changed := !equality.Semantic.DeepEqual(d.s.Job.Status, st)
	due := !from.IsZero() && !d.now.Before(from.Add(CostFlushInterval))
	if !changed && !due && !(from.IsZero() && running) {
		if running {
			recheck = from.Add(CostFlushInterval)
		}
		return st.Cost, recheck
	}
	// The bill's time is stored to the microsecond (metav1.MicroTime): it
	// bills up to that, so the next pass starts exactly there.
	upTo := d.now.Truncate(time.Microsecond)
	if !upTo.After(from) {
		return st.Cost, time.Time{}
	}
	rows := map[costKey]int64{}
	if prev != nil {
		for _, r := range prev.Rows {
			rows[costKey{r.CapacityType, r.InstanceType, r.PricePerHour, r.OnDemandPricePerHour}] += r.Milliseconds
		}
	}
	onDemand := onDemandPrices(d.s.Prices, d.s.Nodes)
	for _, v := range d.pods {
		if v.role != etjobv1.RoleWorker || v.pod.Status.StartTime == nil || v.lost {
			continue
		}
		node := d.s.Nodes[v.pod.Spec.NodeName]
		if node == nil {
			continue
		}
		start, end := v.pod.Status.StartTime.Time, upTo
		if v.terminal && v.finishedAt.Before(upTo) {
			end = v.finishedAt // zero when unknown: nothing more
		}
		if start.Before(from) {
			start = from
		}
		if !end.After(start) {
			continue
		}
		rows[nodeCostKey(d.s.Prices, node, onDemand)] += end.Sub(start).Milliseconds()
	}
	if running {
		recheck = d.now.Add(CostFlushInterval)
	}
	return costStatus(rows, upTo), recheck
}

// onDemandPrices are the on-demand prices by instance type that the
// cluster's on-demand nodes carry (under the admin's price table, when there
// is one): the lowest where nodes of a type carry several, so that the bill
// never claims more savings than the cheapest of them gives, and the same
// nodes always give the same price.
func onDemandPrices(prices *etjobv1.PriceTable, nodes map[string]*corev1.Node) map[string]string {
	low := map[string]etjobv1.PricePerHour{}
	for _, n := range nodes {
		if etjobv1.NodeCapacityType(n.Labels) != etjobv1.CapacityTypeOnDemand {
			continue
		}
		typ := n.Labels[etjobv1.LabelInstanceType]
		if p, ok := NodePrice(prices, n); ok && p > 0 {
			if q, seen := low[typ]; !seen || p < q {
				low[typ] = p
			}
		}
	}
	out := make(map[string]string, len(low))
	for typ, p := range low {
		out[typ] = p.String()
	}
	return out
}

// nodeCostKey is the bill's row of a node: its capacity type, instance
// type, price (under the admin's price table, when there is one) and the
// on-demand price of its type (the table's row, else the node's own label,
// else the lowest of the on-demand nodes of the same type; an on-demand
// node's own price).
func nodeCostKey(prices *etjobv1.PriceTable, node *corev1.Node, onDemand map[string]string) costKey {
	labels := node.Labels
	k := costKey{capacity: etjobv1.NodeCapacityType(labels), instance: labels[etjobv1.LabelInstanceType]}
	if p, ok := NodePrice(prices, node); ok {
		k.price = p.String()
	}
	row, listed := prices.Row(prices.InstanceTypeOf(labels), etjobv1.CapacityTypeOnDemand)
	switch {
	case listed:
		k.onDemand = row.String()
	case labels[etjobv1.LabelOnDemandPricePerHour] != "":
		if p, err := etjobv1.ParsePricePerHour(labels[etjobv1.LabelOnDemandPricePerHour]); err == nil {
			k.onDemand = p.String()
		}
	case k.capacity == etjobv1.CapacityTypeOnDemand:
		k.onDemand = k.price
	default:
		k.onDemand = onDemand[k.instance]
	}
	return k
}

// MaxCostRows is status.cost.rows' bound in the CRD.
const MaxCostRows = 64

// mergeRows folds rows into one at their time-weighted prices, so that the
// bill of a job that ran on more than MaxCostRows prices keeps its totals.
func mergeRows(rows []etjobv1.CostRow) etjobv1.CostRow {
	out := etjobv1.CostRow{CapacityType: rows[0].CapacityType}
	var cost, onDemand float64
	onDemandKnown := true
	for _, r := range rows {
		out.Milliseconds += r.Milliseconds
		p, _ := strconv.ParseFloat(r.PricePerHour, 64)
		cost += p * float64(r.Milliseconds)
		if od, err := strconv.ParseFloat(r.OnDemandPricePerHour, 64); err == nil {
			onDemand += od * float64(r.Milliseconds)
		} else {
			onDemandKnown = false
		}
		if r.CapacityType != out.CapacityType {
			out.CapacityType = ""
		}
	}
	if out.Milliseconds > 0 {
		out.PricePerHour = strconv.FormatFloat(cost/float64(out.Milliseconds), 'f', -1, 64)
		if onDemandKnown {
			out.OnDemandPricePerHour = strconv.FormatFloat(onDemand/float64(out.Milliseconds), 'f', -1, 64)
		}
	}
	return out
}

// costStatus writes the rows out, sorted, with their totals.
func costStatus(rows map[costKey]int64, now time.Time) *etjobv1.CostStatus {
	c := &etjobv1.CostStatus{Time: &metav1.MicroTime{Time: now}}
	for k, v := range rows {
		c.Rows = append(c.Rows, etjobv1.CostRow{CapacityType: k.capacity, InstanceType: k.instance, PricePerHour: k.price,
			OnDemandPricePerHour: k.onDemand, Milliseconds: v})
	}
	// Every field of the key orders the rows, and the totals are summed in
	// that order: the same rows always give the same status (floating-point
	// sums depend on their order).
	sort.Slice(c.Rows, func(i, j int) bool {
		a, b := c.Rows[i], c.Rows[j]
		switch {
		case a.CapacityType != b.CapacityType:
			return a.CapacityType > b.CapacityType // spot first
		case a.InstanceType != b.InstanceType:
			return a.InstanceType < b.InstanceType
		case a.PricePerHour != b.PricePerHour:
			return a.PricePerHour < b.PricePerHour
		}
		return a.OnDemandPricePerHour < b.OnDemandPricePerHour
	})
	var ms int64
	var cost, onDemand float64
	onDemandKnown := true
	for _, r := range c.Rows {
		hours := float64(r.Milliseconds) / float64(time.Hour/time.Millisecond)
		ms += r.Milliseconds
		p, _ := strconv.ParseFloat(r.PricePerHour, 64)
		cost += hours * p
		if od, err := strconv.ParseFloat(r.OnDemandPricePerHour, 64); err == nil {
			onDemand += hours * od
		} else {
			onDemandKnown = false
		}
	}
	if len(c.Rows) > MaxCostRows {
		c.Rows = append(c.Rows[:MaxCostRows-1], mergeRows(c.Rows[MaxCostRows-1:]))
	}
	c.WorkerHours = strconv.FormatFloat(float64(ms)/float64(time.Hour/time.Millisecond), 'f', 6, 64)
	c.Cost = strconv.FormatFloat(cost, 'f', 6, 64)
	if onDemandKnown {
		c.OnDemandCost = strconv.FormatFloat(onDemand, 'f', 6, 64)
	}
	return c
}
