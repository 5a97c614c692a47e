package sim

import (
	"fmt"
	"io"
	"time"

	spottrace "github.com/etjob/etjob/internal/trace"
)

// TraceEvent is one line of a spot availability trace: a remove at At means
// the node is gone at At.
type TraceEvent = spottrace.Event

// Trace is a parsed availability trace.
type Trace struct {
	// Name names the trace in reports (its file name).
	Name string
	// Events are in time order; events at the same time keep their file order.
	Events []TraceEvent
}

// ParseTrace reads a trace with spottrace.Parse, and also refuses an add of a
// node already present, a remove of a node that is not, and a trace with no
// events: the simulation follows each node's life.
func ParseTrace(name string, r io.Reader) (*Trace, error) {
	evs, err := spottrace.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("%s %w", name, err)
	}
	t := &Trace{Name: name, Events: evs}
	alive := map[string]bool{}
	for _, e := range t.Events {
		switch {
		case e.Add && alive[e.Node]:
			return nil, fmt.Errorf("%s: node %s added at %s while present", name, e.Node, e.At)
		case !e.Add && !alive[e.Node]:
			return nil, fmt.Errorf("%s: node %s removed at %s while absent", name, e.Node, e.At)
		}
		alive[e.Node] = e.Add
	}
	if len(t.Events) == 0 {
		return nil, fmt.Errorf("%s: no events", name)
	}
	return t, nil
}

// Scaled returns the trace with every time multiplied by scale (2: the same
// events at half the rate). Notice windows and pauses are not scaled.
func (t *Trace) Scaled(scale float64) *Trace {
	out := &Trace{Name: t.Name, Events: make([]TraceEvent, len(t.Events))}
	for i, e := range t.Events {
		e.At = time.Duration(float64(e.At) * scale)
		out.Events[i] = e
	}
	return out
}

// Span is the time of the last event: the simulated run ends there.
func (t *Trace) Span() time.Duration { return t.Events[len(t.Events)-1].At }

// TraceStats summarise a trace.
type TraceStats struct {
	Name string `json:"name"`
	// Span is the time of the last event.
	Span time.Duration `json:"spanNanoseconds"`
	// Adds and Removes count the events; RemoveTimes counts distinct removal
	// times (several nodes lost at once are one failure of a job).
	Adds        int `json:"adds"`
	Removes     int `json:"removes"`
	RemoveTimes int `json:"removeTimes"`
	// NodeSeconds is the integral of nodes alive over [0, Span]: what a spot
	// fleet that follows the trace pays for.
	NodeSeconds float64 `json:"nodeSeconds"`
	// MeanNodes is NodeSeconds / Span; MaxNodes the most alive at once.
	MeanNodes float64 `json:"meanNodes"`
	MaxNodes  int     `json:"maxNodes"`
}

// Stats computes the trace's statistics.
func (t *Trace) Stats() TraceStats {
	s := TraceStats{Name: t.Name, Span: t.Span()}
	alive := 0
	var last time.Duration
	lastRemove := time.Duration(-1)
	for _, e := range t.Events {
		s.NodeSeconds += float64(alive) * (e.At - last).Seconds()
		last = e.At
		if e.Add {
			alive++
			s.Adds++
		} else {
			alive--
			s.Removes++
			if e.At != lastRemove {
				s.RemoveTimes++
				lastRemove = e.At
			}
		}
		s.MaxNodes = max(s.MaxNodes, alive)
	}
	if s.Span > 0 {
		s.MeanNodes = s.NodeSeconds / s.Span.Seconds()
	}
	return s
}

// capacitySeconds is the integral of min(n, nodes alive) over [0, Span]: the
// most worker-seconds any strategy with at most n workers can train.
func (t *Trace) capacitySeconds(n int) float64 {
	return t.integrate(func(alive int) float64 { return float64(min(alive, n)) })
}

// timeWithAtLeast is the time in [0, Span] during which at least n nodes are
// alive: the most a job of exactly n workers can train.
func (t *Trace) timeWithAtLeast(n int) float64 {
	return t.integrate(func(alive int) float64 {
		if alive >= n {
			return 1
		}
		return 0
	})
}

// integrate is the integral over [0, Span] of f(nodes alive), in seconds.
func (t *Trace) integrate(f func(alive int) float64) float64 {
	alive := 0
	var last time.Duration
	total := 0.0
	for _, e := range t.Events {
		total += f(alive) * (e.At - last).Seconds()
		last = e.At
		if e.Add {
			alive++
		} else {
			alive--
		}
	}
	return total
}
