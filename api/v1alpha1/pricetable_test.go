package v1alpha1_test

import (
	"strings"
	"testing"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// TestParsePriceTable: rows by instance type and capacity type, comments
// and blank lines skipped; the dearest row.
func TestParsePriceTable(t *testing.T) {
	table, err := etjobv1.ParsePriceTable(`
# instance type   capacity    $/hour
p4d.24xlarge      spot        9.83
p4d.24xlarge      on-demand   32.77   # list price

g5.xlarge         spot        0.40
`)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[[2]string]etjobv1.PricePerHour{
		{"p4d.24xlarge", "spot"}: 9.83, {"p4d.24xlarge", "on-demand"}: 32.77, {"g5.xlarge", "spot"}: 0.40,
	} {
		if got, ok := table.Row(key[0], key[1]); !ok || got != want {
			t.Errorf("Row(%s, %s) = %v, %v; want %v", key[0], key[1], got, ok, want)
		}
	}
	if _, ok := table.Row("g5.xlarge", "on-demand"); ok {
		t.Error("a row the table does not list was found")
	}
	if got := table.Dearest(); got != 32.77 {
		t.Errorf("Dearest = %v, want 32.77", got)
	}
	var none *etjobv1.PriceTable
	if _, ok := none.Row("g5.xlarge", "spot"); ok || none.Dearest() != 0 {
		t.Error("a nil table has rows")
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
