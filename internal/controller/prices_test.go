package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/scheme"
)

// TestPriceTables: the admin's table is read at most every
// PriceTableRefresh; none is no table; one that does not parse leaves the
// last good one in force.
func TestPriceTables(t *testing.T) {
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "etjob-system", Name: "etjob-prices"}
	c := fake.NewClientBuilder().WithScheme(scheme.New()).Build()
	clk := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
	p := &PriceTables{Reader: c, Key: key, Clock: clk, KeyLabelPrefix: "node-restriction.kubernetes.io/etjob-"}
	if got := p.Get(ctx); got != nil {
		t.Fatalf("no ConfigMap: table %+v, want none", got)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Data: map[string]string{etjobv1.PriceTableKey: "g5.xlarge spot 0.5\n"}}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if got := p.Get(ctx); got != nil {
		t.Fatalf("read again before %v: %+v", PriceTableRefresh, got)
	}
	clk.SetTime(clk.Now().Add(PriceTableRefresh))
	if got, _ := p.Get(ctx).Row("g5.xlarge", etjobv1.CapacityTypeSpot); got != 0.5 {
		t.Fatalf("after the refresh: g5.xlarge spot %v, want 0.5", got)
	}
	if got := p.Get(ctx).KeyLabelPrefix; got != p.KeyLabelPrefix {
		t.Errorf("the table's rows keyed by %q, want --price-key-label-prefix's %q", got, p.KeyLabelPrefix)
	}
	cm.Data[etjobv1.PriceTableKey] = "g5.xlarge spot cheap\n"
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(PriceTableRefresh))
	if got, _ := p.Get(ctx).Row("g5.xlarge", etjobv1.CapacityTypeSpot); got != 0.5 {
		t.Errorf("a table that does not parse: g5.xlarge spot %v, want the last good 0.5", got)
	}
	if err := c.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(PriceTableRefresh))
	if got := p.Get(ctx); got != nil {
		t.Errorf("the ConfigMap deleted: table %+v, want none", got)
	}
	var none *PriceTables
	if none.Get(ctx) != nil {
		t.Error("a nil PriceTables has a table")
	}
}

// TestPriceTablesRequired (issue #42, M5): with --price-table-required an
// absent or unreadable table fails closed, an empty table (no node has a
// price, its own not believed), and a table once read stays in force when
// its ConfigMap is deleted. Without the flag an absent table trusts the
// nodes (TestPriceTables).
func TestPriceTablesRequired(t *testing.T) {
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "etjob-system", Name: "etjob-prices"}
	c := fake.NewClientBuilder().WithScheme(scheme.New()).Build()
	clk := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
	p := PriceTableFlags{Key: key, Required: true}.PriceTables(c, clk)
	cheap := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rooted",
		Labels:      map[string]string{etjobv1.LabelInstanceType: "p4d.24xlarge", etjobv1.LabelCapacityType: etjobv1.CapacityTypeSpot},
		Annotations: map[string]string{etjobv1.AnnotationPricePerHour: "0.01"}}}
	if got, ok := core.NodePrice(p.Get(ctx), cheap); ok {
		t.Fatalf("required and absent: a node claiming 0.01 costs %v, want no price", got)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Data: map[string]string{etjobv1.PriceTableKey: "p4d.24xlarge spot 9.83\n"}}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(PriceTableRefresh))
	if got, ok := core.NodePrice(p.Get(ctx), cheap); !ok || got != 9.83 {
		t.Fatalf("the table read: %v, %v; want 9.83", got, ok)
	}
	if err := c.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(PriceTableRefresh))
	if got, ok := core.NodePrice(p.Get(ctx), cheap); !ok || got != 9.83 {
		t.Errorf("the ConfigMap deleted: %v, %v; want the last table's 9.83", got, ok)
	}

	// A table that never parsed: no price either.
	c = fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Data:       map[string]string{etjobv1.PriceTableKey: "p4d.24xlarge spot cheap\n"}}).Build()
	p = PriceTableFlags{Key: key, Required: true}.PriceTables(c, clk)
	if got, ok := core.NodePrice(p.Get(ctx), cheap); ok {
		t.Errorf("required and unparsable: a node claiming 0.01 costs %v, want no price", got)
	}
}

// TestParsePriceKeyLabelPrefix (issue #42, H2): a prefix that makes two
// label keys; one a kubelet may set is taken and said.
func TestParsePriceKeyLabelPrefix(t *testing.T) {
	for in, wantWarning := range map[string]bool{"": false, "node-restriction.kubernetes.io/etjob-": false,
		"node-restriction.kubernetes.io/": false, "example.com/": true, "etjob-": true} {
		w, err := ParsePriceKeyLabelPrefix(in)
		if err != nil || (w != "") != wantWarning {
			t.Errorf("%q: warning %q, error %v; want a warning %v", in, w, err, wantWarning)
		}
	}
	for _, bad := range []string{"a/b/", "Upper.Case/", "-bad", "x y"} {
		if _, err := ParsePriceKeyLabelPrefix(bad); err == nil || !strings.Contains(err.Error(), "label key") {
			t.Errorf("%q: error %v, want one about the label key", bad, err)
		}
	}
}

func TestParsePriceTableFlag(t *testing.T) {
	if got, err := ParsePriceTableFlag("etjob-system/etjob-prices"); err != nil || got.Namespace != "etjob-system" || got.Name != "etjob-prices" {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"etjob-prices", "/x", "ns/", "a/b/c"} {
		if _, err := ParsePriceTableFlag(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
