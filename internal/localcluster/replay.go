package localcluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// TraceEvent is one line of a spot availability trace
// (`milliseconds_since_start,add|remove,node_name`, ../shared/traces/).
type TraceEvent struct {
	At   time.Duration
	Add  bool
	Node string
}

// ParseTrace reads a trace, naming the line of any malformed entry. On an
// error it returns no events.
func ParseTrace(r io.Reader) ([]TraceEvent, error) {
	var out []TraceEvent
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
		// product wrapped to a negative time (FuzzParseTrace).
		if err != nil || ms < 0 || ms > maxTraceMillis {
			return nil, fmt.Errorf("line %d: %q is not a time in milliseconds (0 to %d)", n, f[0], maxTraceMillis)
		}
		op := strings.TrimSpace(f[1])
		if op != "add" && op != "remove" {
			return nil, fmt.Errorf("line %d: %q is neither add nor remove", n, op)
		}
		node := strings.TrimSpace(f[2])
		if node == "" {
			return nil, fmt.Errorf("line %d: %q names no node", n, line)
		}
		out = append(out, TraceEvent{At: time.Duration(ms) * time.Millisecond, Add: op == "add", Node: node})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", n, err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out, nil
}

// maxTraceMillis is the largest trace time, in milliseconds, that a
// time.Duration holds (about 292 years).
const maxTraceMillis = math.MaxInt64 / int64(time.Millisecond)

// ReplayOptions say how to replay a trace on the cluster.
type ReplayOptions struct {
	// Speedup divides the trace's times (60: an hour in a minute).
	Speedup float64
	// Notice is the reclamation notice of every removal (0: hard losses).
	Notice time.Duration
	// MaxNodes caps the trace's nodes alive at once: this machine holds a few
	// process nodes, the traces up to 32; adds beyond the cap (and their
	// removals) are skipped and counted.
	MaxNodes int
	// Log receives one line per event.
	Log func(format string, args ...any)
}

// Replay adds a spot node for every `add` and reclaims the matching node for
// every `remove`, at the trace's times divided by Speedup. Removals do not wait
// for their notice to run out before the next event.
func (c *Cluster) Replay(ctx context.Context, events []TraceEvent, o ReplayOptions) (skipped int, err error) {
	if o.Speedup <= 0 {
		return 0, fmt.Errorf("speedup must be positive")
	}
	local := map[string]string{} // trace node -> local node
	start := time.Now()
	errs := make(chan error, len(events))
	pending := 0
	for _, e := range events {
		at := start.Add(time.Duration(float64(e.At) / o.Speedup))
		select {
		case <-ctx.Done():
			return skipped, ctx.Err()
		case <-time.After(time.Until(at)):
		}
		switch {
		case e.Add && o.MaxNodes > 0 && len(local) >= o.MaxNodes:
			skipped++
			local[e.Node] = "" // its removal is skipped too
		case e.Add:
			name, err := c.AddNode(ctx, "", true)
			if err != nil {
				return skipped, err
			}
			local[e.Node] = name
			o.Log("%8s  add %-8s -> %s", e.At, e.Node, name)
		default:
			name, ok := local[e.Node]
			delete(local, e.Node)
			if !ok || name == "" {
				skipped++
				continue
			}
			o.Log("%8s  remove %-8s -> reclaim %s (notice %s)", e.At, e.Node, name, o.Notice)
			pending++
			go func() { errs <- c.Reclaim(ctx, name, o.Notice) }()
		}
	}
	for range pending {
		if err := <-errs; err != nil {
			return skipped, err
		}
	}
	return skipped, nil
}
