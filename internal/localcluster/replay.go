package localcluster

import (
	"context"
	"fmt"
	"time"

	"github.com/etjob/etjob/internal/trace"
)

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
func (c *Cluster) Replay(ctx context.Context, events []trace.Event, o ReplayOptions) (skipped int, err error) {
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
