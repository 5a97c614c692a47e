package core

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// The price policies as functions. Decide's tables (price_test.go) keep the
// stories across policies.

func onNode(name, node string, index int32, extra bool) *podView {
	return &podView{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: node}},
		index: index, extra: extra, scheduled: true, ready: true}
}

func TestOverPriceLeavers(t *testing.T) {
	prices := map[string]etjobv1.PricePerHour{"cheap": 0.5, "dear": 2}
	over := func(node string) (etjobv1.PricePerHour, bool) { return prices[node], prices[node] > 1 }
	unscheduled := onNode("w3", "", 3, false)
	unscheduled.scheduled = false
	ws := []*podView{onNode("w0", "cheap", 0, false), onNode("w1", "dear", 1, false), onNode("w2", "dear", 2, false), unscheduled}
	got := overPriceLeavers(ws, map[string]bool{"w2": true}, over)
	if len(got) != 1 || got[0].w.pod.Name != "w1" || got[0].price != 2 {
		t.Errorf("leavers %+v, want w1 at 2 (w2 is gone already, w3 is on no node)", got)
	}
}

func TestOverBudgetLeavers(t *testing.T) {
	prices := map[string]etjobv1.PricePerHour{"a": 1, "b": 1, "c": 3, "free": 0}
	price := func(node string) etjobv1.PricePerHour { return prices[node] }
	ws := []*podView{onNode("w0", "a", 0, false), onNode("w1", "b", 1, false), onNode("w2", "b", 2, true), onNode("w3", "c", 3, false),
		onNode("w4", "free", 4, false)}
	for _, c := range []struct {
		budget etjobv1.PricePerHour
		want   string
	}{
		{6, ""},               // 1+1+1+3 = 6 fits
		{5, "w3"},             // the dearest first
		{2, "w3, w2"},         // then, at equal prices, the extra worker
		{1, "w3, w2, w1"},     // then the highest index
		{0, "w3, w2, w1, w0"}, // never the worker on an unpriced node
	} {
		got := overBudgetLeavers(c.budget, ws, price)
		var leaving []*podView
		for _, l := range got {
			leaving = append(leaving, l.w)
		}
		if names(leaving) != c.want {
			t.Errorf("budget %v: %q leave, want %q", c.budget, names(leaving), c.want)
		}
		if len(got) > 0 && got[0].was != 6 {
			t.Errorf("budget %v: the first leaver saw a spend of %v, want 6", c.budget, got[0].was)
		}
	}
}
