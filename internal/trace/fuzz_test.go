package trace

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// FuzzParse feeds Parse any text (`etjob-local cluster replay` and `etjob-local sim` read
// the user's trace files). Properties: no panic; an error names its line and
// comes with no events; the events are sorted by time, none before the
// start, each naming a node; and written back as CSV they parse to the same
// events. Seeds: the documented line shapes plus the shared traces' heads.
//
//	go test -run '^$' -fuzz '^FuzzParse$' -fuzztime 60s ./internal/trace
func FuzzParse(f *testing.F) {
	f.Add("0,add,node1\n60000,remove,node1\n\n30000,add,node2\n")
	f.Add("# ms,op,node\n 480000 , add , node1 \r\n540000,remove,node1")
	for _, name := range []string{"ec2-p3-trace.csv", "ec2-g4dn-trace.csv"} {
		if raw, err := readShared(name); err == nil {
			f.Add(raw[:min(len(raw), 400)])
		}
	}
	f.Fuzz(func(t *testing.T, text string) {
		evs, err := Parse(strings.NewReader(text))
		if err != nil {
			if evs != nil || !strings.HasPrefix(err.Error(), "line ") {
				t.Fatalf("error %q with %d events: want one naming its line, and no events", err, len(evs))
			}
			return
		}
		if !slices.IsSortedFunc(evs, func(a, b Event) int { return cmp.Compare(a.At, b.At) }) {
			t.Fatalf("events not in time order: %+v", evs)
		}
		var csv strings.Builder
		for _, e := range evs {
			if e.At < 0 || e.At%time.Millisecond != 0 || e.Node == "" || strings.ContainsAny(e.Node, ",\n") || strings.TrimSpace(e.Node) != e.Node {
				t.Fatalf("event %+v: want a time of 0 or more whole milliseconds and a node name", e)
			}
			op := "remove"
			if e.Add {
				op = "add"
			}
			fmt.Fprintf(&csv, "%d,%s,%s\n", e.At/time.Millisecond, op, e.Node)
		}
		again, err := Parse(strings.NewReader(csv.String()))
		if err != nil || !slices.Equal(again, evs) {
			t.Fatalf("written back as\n%s\nthe trace parses to %+v, %v; want %+v", csv.String(), again, err, evs)
		}
	})
}
