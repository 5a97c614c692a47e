package v1alpha1_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

func node(instance, capacity, own string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{
		etjobv1.LabelInstanceType: instance, etjobv1.LabelCapacityType: capacity}}}
	if own != "" {
		n.Annotations = map[string]string{etjobv1.AnnotationPricePerHour: own}
	}
	return n
}

// TestPriceTable (issue #26, N7): under the admin's table a node's own price
// can raise its row's price, never lower it; a node the table does not list
// costs the dearest row; without a table the node's own price stands.
func TestPriceTable(t *testing.T) {
	table, err := etjobv1.ParsePriceTable(`
# instance type   capacity    $/hour
p4d.24xlarge      spot        9.83
p4d.24xlarge      on-demand   32.77   # list price
g5.xlarge         spot        0.40
`)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		table  *etjobv1.PriceTable
		node   *corev1.Node
		want   etjobv1.PricePerHour
		wantOK bool
	}{
		"a rooted node claims to be cheap": {table, node("p4d.24xlarge", "spot", "0.01"), 9.83, true},
		"the spot market rose":             {table, node("p4d.24xlarge", "spot", "12.5"), 12.5, true},
		"no price of its own":              {table, node("g5.xlarge", "spot", ""), 0.40, true},
		"on demand":                        {table, node("p4d.24xlarge", "on-demand", "1"), 32.77, true},
		"a type the table does not list":   {table, node("made-up.nano", "spot", "0.001"), 32.77, true},
		"no table: the node's own":         {nil, node("p4d.24xlarge", "spot", "0.01"), 0.01, true},
		"no table, no price":               {nil, node("p4d.24xlarge", "spot", ""), 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := tc.table.Price(tc.node)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("Price = %v, %v; want %v, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestParsePriceTableErrors(t *testing.T) {
	for text, want := range map[string]string{
		"p4d spot":                     "line 1",
		"p4d reserved 1.0":             `capacity type "reserved"`,
		"p4d spot -1":                  "line 1: price per hour",
		"a spot 1\nb spot 2\na spot 3": "line 3: a spot is listed twice",
		"# only a comment\n":           "no rows",
	} {
		_, err := etjobv1.ParsePriceTable(text)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePriceTable(%q) = %v, want an error with %q", text, err, want)
		}
	}
}
