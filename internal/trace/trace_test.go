package trace

import (
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	evs, err := Parse(strings.NewReader("0,add,node1\n60000,remove,node1\n\n30000,add,node2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 || evs[1].At != 30*time.Second || evs[1].Node != "node2" || evs[2].Add {
		t.Errorf("events = %+v", evs)
	}
	for _, bad := range []string{"x,add,n", "0,grow,n", "0,add", "-5,add,n"} {
		if _, err := Parse(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: err = %v, want one naming line 1", bad, err)
		}
	}
}

func TestParseSharedTraces(t *testing.T) {
	for _, f := range []string{"ec2-p3-trace.csv", "ec2-g4dn-trace.csv"} {
		raw, err := readShared(f)
		if err != nil {
			t.Fatalf("traces/%s: %v", f, err)
		}
		evs, err := Parse(strings.NewReader(raw))
		if err != nil || len(evs) < 50 {
			t.Errorf("%s: %d events, %v", f, len(evs), err)
		}
	}
}
