package instancetype

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

func TestLookupAndCapacity(t *testing.T) {
	p3, ok := Lookup("p3.2xlarge")
	if !ok || p3 != P32xlarge {
		t.Fatalf("Lookup(p3.2xlarge) = %+v, %v", p3, ok)
	}
	c := p3.Capacity()
	if cpu, mem, gpu := c[corev1.ResourceCPU], c[corev1.ResourceMemory], c[etjobv1.ResourceGPU]; cpu.String() != "8" || mem.String() != "61Gi" || gpu.String() != "1" {
		t.Errorf("p3.2xlarge capacity: cpu %s, memory %s, gpu %s; want 8, 61Gi, 1", cpu.String(), mem.String(), gpu.String())
	}
	if _, has := M5Xlarge.Capacity()[etjobv1.ResourceGPU]; has {
		t.Error("m5.xlarge advertises a GPU")
	}
	if _, ok := Lookup("x1.nothing"); ok {
		t.Error("an unknown type was found")
	}
}

// TestPriceTable: the rendered table parses as the controller's price table
// and prices every type as the table does.
func TestPriceTable(t *testing.T) {
	pt, err := etjobv1.ParsePriceTable(PriceTable())
	if err != nil {
		t.Fatalf("%v\n%s", err, PriceTable())
	}
	for _, ty := range All {
		if p, ok := pt.Row(ty.Name, etjobv1.CapacityTypeOnDemand); !ok || p != ty.OnDemandPrice {
			t.Errorf("%s on-demand: %v, %v; want %v", ty.Name, p, ok, ty.OnDemandPrice)
		}
		p, ok := pt.Row(ty.Name, etjobv1.CapacityTypeSpot)
		if want := ty.SpotPrice > 0; ok != want || (want && p != ty.SpotPrice) {
			t.Errorf("%s spot: %v, %v; want %v", ty.Name, p, ok, ty.SpotPrice)
		}
	}
}
