package v1alpha1

import (
	"bufio"
	"fmt"
	"strings"
)

// PriceTableKey is the ConfigMap key that holds a price table
// (ParsePriceTable): the platform admin's prices, which nodes cannot write
// (issue #26, N7).
const PriceTableKey = "prices"

// PriceTable is the platform admin's prices of nodes, in US dollars an hour,
// by instance type and capacity type ("p4d.24xlarge spot"): prices nodes
// cannot write. How a node is priced under it is the decision core's rule
// (core.NodePrice).
type PriceTable struct {
	// Prices are the rows, by "<instance type> <capacity type>".
	Prices map[string]PricePerHour `json:"prices"`
	// KeyLabelPrefix, when set (the controller's --price-key-label-prefix),
	// is where a node's row is read from: its labels <prefix>instance-type
	// and <prefix>capacity-type, which the admin sets, instead of the
	// instance-type and capacity labels its kubelet writes (issue #42, H2:
	// a rooted kubelet may relabel its node as a cheaper row). A node
	// without them is not listed: it costs the dearest row.
	KeyLabelPrefix string `json:"-"`
}

// PriceKeyInstanceType and PriceKeyCapacityType are the label names, after
// PriceTable.KeyLabelPrefix, of a node's row in the price table.
const (
	PriceKeyInstanceType = "instance-type"
	PriceKeyCapacityType = "capacity-type"
)

// InstanceTypeOf is node labels' instance type as the table reads it: the
// admin's label under KeyLabelPrefix when it is set, else the kubelet's.
func (t *PriceTable) InstanceTypeOf(labels map[string]string) string {
	if t != nil && t.KeyLabelPrefix != "" {
		return labels[t.KeyLabelPrefix+PriceKeyInstanceType]
	}
	return labels[LabelInstanceType]
}

// RowOf returns node labels' row: by the admin's labels under
// KeyLabelPrefix when it is set, else by the kubelet's instance-type and
// capacity labels.
func (t *PriceTable) RowOf(labels map[string]string) (PricePerHour, bool) {
	if t != nil && t.KeyLabelPrefix != "" {
		it, ct := labels[t.KeyLabelPrefix+PriceKeyInstanceType], labels[t.KeyLabelPrefix+PriceKeyCapacityType]
		if it == "" || ct == "" {
			return 0, false
		}
		return t.Row(it, ct)
	}
	return t.Row(labels[LabelInstanceType], NodeCapacityType(labels))
}

// ParsePriceTable reads a price table: one row a line, "<instance type>
// <capacity type> <US dollars an hour>", fields separated by spaces or
// tabs, capacity type "spot" or "on-demand"; "#" starts a comment. An error
// names the line.
func ParsePriceTable(text string) (*PriceTable, error) {
	t := &PriceTable{Prices: map[string]PricePerHour{}}
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d %q: want <instance type> <capacity type> <US dollars an hour>", n, strings.TrimSpace(line))
		}
		if f[1] != CapacityTypeSpot && f[1] != CapacityTypeOnDemand {
			return nil, fmt.Errorf("line %d: capacity type %q: want %q or %q", n, f[1], CapacityTypeSpot, CapacityTypeOnDemand)
		}
		p, err := ParsePricePerHour(f[2])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		key := f[0] + " " + f[1]
		if _, dup := t.Prices[key]; dup {
			return nil, fmt.Errorf("line %d: %s %s is listed twice", n, f[0], f[1])
		}
		t.Prices[key] = p
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(t.Prices) == 0 {
		return nil, fmt.Errorf("no rows: want lines of <instance type> <capacity type> <US dollars an hour>")
	}
	return t, nil
}

// Row is the table's price of an instance type at a capacity type.
func (t *PriceTable) Row(instanceType, capacityType string) (PricePerHour, bool) {
	if t == nil {
		return 0, false
	}
	p, ok := t.Prices[instanceType+" "+capacityType]
	return p, ok
}

// Dearest is the table's highest price.
func (t *PriceTable) Dearest() PricePerHour {
	var out PricePerHour
	if t != nil {
		for _, p := range t.Prices {
			out = max(out, p)
		}
	}
	return out
}
