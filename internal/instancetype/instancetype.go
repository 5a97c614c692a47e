// Package instancetype is the one table of the cloud instance types that
// etjob's local cluster and trace simulator use: what a node of each type
// offers (CPUs, memory, GPUs) and what it costs (on demand and on spot). The
// local cluster's nodes advertise their type's capacity and register with its
// prices; the simulator bills at them; PriceTable renders them as a platform
// admin's price table (the controller's --price-table).
package instancetype

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Type is one instance type.
type Type struct {
	Name      string
	CPUs      int64
	MemoryGiB int64
	GPUs      int64
	// OnDemandPrice is the on-demand price, US dollars an hour.
	OnDemandPrice etjobv1.PricePerHour
	// SpotPrice is the spot price used here; 0 where the type is only
	// bought on demand here.
	SpotPrice etjobv1.PricePerHour
}

// The types. GPU nodes are p3.2xlarge (one V100, 8 vCPUs, 61 GiB) at the
// prices Bamboo (NSDI'23) used, so that local cost reports and simulations can
// be set beside published numbers; launcher nodes are m5.xlarge and the
// system node m5.large, both CPU-only and on demand (us-east-1 prices).
var (
	P32xlarge = Type{Name: "p3.2xlarge", CPUs: 8, MemoryGiB: 61, GPUs: 1, OnDemandPrice: 3.06, SpotPrice: 0.91}
	M5Xlarge  = Type{Name: "m5.xlarge", CPUs: 4, MemoryGiB: 16, OnDemandPrice: 0.192}
	M5Large   = Type{Name: "m5.large", CPUs: 2, MemoryGiB: 8, OnDemandPrice: 0.096}
)

// All are the types, in the table's order.
var All = []Type{P32xlarge, M5Xlarge, M5Large}

// Lookup returns the type called name.
func Lookup(name string) (Type, bool) {
	for _, t := range All {
		if t.Name == name {
			return t, true
		}
	}
	return Type{}, false
}

// Capacity is what a node of the type advertises: cpu, memory and, where it
// has any, nvidia.com/gpu.
func (t Type) Capacity() corev1.ResourceList {
	c := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(t.CPUs, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(t.MemoryGiB<<30, resource.BinarySI),
	}
	if t.GPUs > 0 {
		c[etjobv1.ResourceGPU] = *resource.NewQuantity(t.GPUs, resource.DecimalSI)
	}
	return c
}

// PriceTable is the table's prices as a platform admin's price table
// (etjobv1.ParsePriceTable's format): an on-demand row for every type and a
// spot row for every type with a spot price.
func PriceTable() string {
	var b strings.Builder
	for _, t := range All {
		fmt.Fprintf(&b, "%s %s %s\n", t.Name, etjobv1.CapacityTypeOnDemand, t.OnDemandPrice)
		if t.SpotPrice > 0 {
			fmt.Fprintf(&b, "%s %s %s\n", t.Name, etjobv1.CapacityTypeSpot, t.SpotPrice)
		}
	}
	return b.String()
}
