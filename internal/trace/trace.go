// Package trace reads spot availability traces
// (`milliseconds_since_start,add|remove,node_name`, the repository's traces/): the
// one parser behind `etjob-local cluster replay` and the trace simulator.
package trace

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Event is one line of a trace: a remove at At means the node is gone at At.
type Event struct {
	At   time.Duration
	Add  bool
	Node string
}

// Parse reads a trace, naming the line of any malformed entry. On an
// error it returns no events.
func Parse(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	n := 1
	for ; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d: %q is not ms,add|remove,node", n, line)
		}
		ms, err := strconv.ParseInt(strings.TrimSpace(f[0]), 10, 64)
		// The bound keeps ms milliseconds a time.Duration: past it the
		// product wrapped to a negative time (FuzzParse).
		if err != nil || ms < 0 || ms > maxMillis {
			return nil, fmt.Errorf("line %d: %q is not a time in milliseconds (0 to %d)", n, f[0], maxMillis)
		}
		op := strings.TrimSpace(f[1])
		if op != "add" && op != "remove" {
			return nil, fmt.Errorf("line %d: %q is neither add nor remove", n, op)
		}
		node := strings.TrimSpace(f[2])
		if node == "" {
			return nil, fmt.Errorf("line %d: %q names no node", n, line)
		}
		out = append(out, Event{At: time.Duration(ms) * time.Millisecond, Add: op == "add", Node: node})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", n, err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out, nil
}

// maxMillis is the largest trace time, in milliseconds, that a
// time.Duration holds (about 292 years).
const maxMillis = math.MaxInt64 / int64(time.Millisecond)
