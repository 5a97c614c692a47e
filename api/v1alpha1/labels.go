package v1alpha1

import (
	"fmt"
	"math"
	"strconv"

	corev1 "k8s.io/api/core/v1"
)

// The node labels etjob reads to tell spot capacity from on-demand and to
// price it. Clouds spell capacity in several ways (internal/render lists
// them); LabelCapacityType is the one etjob's own nodes and reports use.
const (
	// LabelCapacityType is Karpenter's capacity label, on any cloud and on
	// etjob's local cluster: CapacityTypeSpot or CapacityTypeOnDemand.
	LabelCapacityType    = "karpenter.sh/capacity-type"
	CapacityTypeSpot     = "spot"
	CapacityTypeOnDemand = "on-demand"

	// LabelPricePerHour on a node is its price in US dollars per hour, a
	// decimal number ("0.91"): what status.cost, `etjob cost` and the demo
	// charge, and what spec.spot.maxPricePerHour is held against. An
	// annotation of the same key, where a price feed writes the current
	// price, comes first (NodePrice).
	LabelPricePerHour = "etjob.dev/price-per-hour"
	// AnnotationPricePerHour on a node is its current price, as a price
	// feed (the node agent's price source) writes it; it comes before the
	// label (NodePrice). The same key as the label.
	AnnotationPricePerHour = LabelPricePerHour
	// LabelOnDemandPricePerHour on a node is the on-demand price of its
	// instance type, where no on-demand node of that type says it.
	LabelOnDemandPricePerHour = "etjob.dev/on-demand-price-per-hour"
	// LabelInstanceType is the well-known instance type label.
	LabelInstanceType = "node.kubernetes.io/instance-type"
)

// SpotLabels maps the node labels that real clouds use to mark spot
// capacity to their spot value. Workers of spot jobs prefer nodes matching
// any; launchers of spot jobs require nodes matching none; a node matching
// any is billed as spot.
var SpotLabels = map[string]string{
	LabelCapacityType:                            CapacityTypeSpot, // Karpenter (any cloud), and etjob's local cluster
	"eks.amazonaws.com/capacityType":             "SPOT",           // EKS managed node groups
	"cloud.google.com/gke-spot":                  "true",           // GKE Spot VMs
	"cloud.google.com/gke-preemptible":           "true",           // GKE preemptible VMs
	"kubernetes.azure.com/scalesetpriority":      "spot",           // AKS spot node pools
	"node.alibabacloud.com/instance-charge-type": "SpotInstance",   // ACK spot node pools
}

// NodeCapacityType is CapacityTypeSpot for a node with any cloud's spot
// label (SpotLabels), else CapacityTypeOnDemand.
func NodeCapacityType(labels map[string]string) string {
	for k, v := range SpotLabels {
		if labels[k] == v {
			return CapacityTypeSpot
		}
	}
	return CapacityTypeOnDemand
}

// PricePerHour is a price in US dollars per node-hour: a node's, in its
// LabelPricePerHour label, or a simulated one.
type PricePerHour float64

// ParsePricePerHour reads a LabelPricePerHour value.
func ParsePricePerHour(s string) (PricePerHour, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("price per hour %q: want a decimal number of US dollars, 0 or more", s)
	}
	return PricePerHour(f), nil
}

// NodePrice is a node's current price: its etjob.dev/price-per-hour
// annotation, where a price feed writes the market's price as it moves
// (labels are the node's own, and its kubelet puts back the ones it
// registered with), else the label of the same name; ok is false when
// neither holds a price.
func NodePrice(n *corev1.Node) (p PricePerHour, ok bool) {
	if v, found := n.Annotations[AnnotationPricePerHour]; found {
		if p, err := ParsePricePerHour(v); err == nil {
			return p, true
		}
	}
	return NodePricePerHour(n.Labels)
}

// NodePricePerHour is the price in a node's labels; ok is false when the
// label is missing or not a price.
func NodePricePerHour(labels map[string]string) (p PricePerHour, ok bool) {
	v, found := labels[LabelPricePerHour]
	if !found {
		return 0, false
	}
	p, err := ParsePricePerHour(v)
	return p, err == nil
}

// String is the label value: the shortest decimal that reads back the same.
func (p PricePerHour) String() string { return strconv.FormatFloat(float64(p), 'f', -1, 64) }

// Cost is the price of hours node-hours.
func (p PricePerHour) Cost(hours float64) float64 { return hours * float64(p) }
