package v1alpha1

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPricePerHour(t *testing.T) {
	for _, s := range []string{"0.91", "3.06", "0", "0.192", "12"} {
		p, err := ParsePricePerHour(s)
		if err != nil || p.String() != s {
			t.Errorf("ParsePricePerHour(%q) = %v, %v; want it back", s, p, err)
		}
	}
	for _, s := range []string{"", "-1", "abc", "NaN", "+Inf", "1,5"} {
		if _, err := ParsePricePerHour(s); err == nil {
			t.Errorf("ParsePricePerHour(%q): no error", s)
		}
	}
	if p, ok := NodePricePerHour(map[string]string{LabelPricePerHour: "0.91"}); !ok || p != 0.91 {
		t.Errorf("NodePricePerHour = %v, %v", p, ok)
	}
	if _, ok := NodePricePerHour(map[string]string{}); ok {
		t.Error("no label: ok")
	}
	if _, ok := NodePricePerHour(map[string]string{LabelPricePerHour: "cheap"}); ok {
		t.Error("a label that is no price: ok")
	}
	node := func(label, annotation string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{}, Annotations: map[string]string{}}}
		if label != "" {
			n.Labels[LabelPricePerHour] = label
		}
		if annotation != "" {
			n.Annotations[AnnotationPricePerHour] = annotation
		}
		return n
	}
	for _, tc := range []struct {
		label, annotation string
		want              PricePerHour
		ok                bool
	}{
		{"0.91", "", 0.91, true},
		{"0.91", "1.5", 1.5, true},   // a price feed's current price first
		{"0.91", "dear", 0.91, true}, // an annotation that is no price: the label
		{"", "1.5", 1.5, true},
		{"", "", 0, false},
	} {
		if p, ok := NodePrice(node(tc.label, tc.annotation)); p != tc.want || ok != tc.ok {
			t.Errorf("NodePrice(label %q, annotation %q) = %v, %v; want %v, %v", tc.label, tc.annotation, p, ok, tc.want, tc.ok)
		}
	}
	if c := PricePerHour(3.06).Cost(2); c != 6.12 {
		t.Errorf("Cost(2h) = %v", c)
	}
}

func TestNodeCapacityType(t *testing.T) {
	for _, tc := range []struct {
		labels map[string]string
		want   string
	}{
		{map[string]string{LabelCapacityType: CapacityTypeSpot}, CapacityTypeSpot},
		{map[string]string{"cloud.google.com/gke-spot": "true"}, CapacityTypeSpot},
		{map[string]string{"eks.amazonaws.com/capacityType": "SPOT"}, CapacityTypeSpot},
		{map[string]string{"eks.amazonaws.com/capacityType": "ON_DEMAND"}, CapacityTypeOnDemand},
		{map[string]string{LabelCapacityType: CapacityTypeOnDemand}, CapacityTypeOnDemand},
		{map[string]string{}, CapacityTypeOnDemand},
	} {
		if got := NodeCapacityType(tc.labels); got != tc.want {
			t.Errorf("NodeCapacityType(%v) = %q, want %q", tc.labels, got, tc.want)
		}
	}
}
