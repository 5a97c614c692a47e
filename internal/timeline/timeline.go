// Package timeline turns a job's life into a picture (issue #6): the workers
// it had over time, what happened to it (reclamation notices, leaves, joins,
// suspend and resume) and how far training got, as a PNG (internal/timeline/chart) and as
// text for a terminal (Text).
//
// Its input is a small pure Timeline, built from an ElasticJob's
// status.timeline (FromStatus) and, where the training logs are at hand (the
// demo), from the ranks' step lines (AddTraining). Rendering reads no clock:
// the same Timeline gives the same text and the same image.
package timeline

import (
	"fmt"
	"slices"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
)

// Event types beyond status.timeline's (etjobv1.Timeline*), read from the
// training logs.
const (
	// TypeStopped is the ranks' agreed stop at a step (a `stop` line).
	TypeStopped = "Stopped"
	// TypeTrained is training (re)starting from a step (a `resume` line).
	TypeTrained = "Trained"
	// TypeFinished is training's end (a `final` line).
	TypeFinished = "Finished"
)

// Timeline is a job's life. Every series is in time order; a series value
// holds from its point until the next one.
type Timeline struct {
	// Job is the job's name, the title.
	Job string
	// Start and End bound the picture.
	Start, End time.Time
	// Truncated says that older events were dropped (status.timeline keeps
	// the newest 64), so Members before the first event is unknown.
	Truncated bool
	// Members is the number of published members.
	Members []Point
	// World is the number of ranks training (the world size of the logged
	// steps), 0 while training is stopped.
	World []Point
	// Steps is the highest training step any rank finished.
	Steps []Point
	// Events are what happened, in time order.
	Events []Event
}

// Point is a value from a time on.
type Point struct {
	At    time.Time
	Value int
}

// Event is one thing that happened to the job.
type Event struct {
	At time.Time
	// Type is the status.timeline type (Join, Leave, Notice, ...) or one of
	// TypeStopped, TypeTrained, TypeFinished.
	Type string
	// Members is the number of published members after the event; -1 when
	// unknown.
	Members int
	// Message says what happened.
	Message string
}

// FromStatus builds the timeline that job's status records, from its
// creation (or its oldest kept event) to its completion, else now.
func FromStatus(job *etjobv1.ElasticJob, now time.Time) Timeline {
	t := Timeline{Job: job.Name, Start: job.CreationTimestamp.Time, End: now}
	if c := job.Status.CompletionTime; c != nil {
		t.End = c.Time
	}
	entries := job.Status.Timeline
	if len(entries) == 0 {
		return t // nothing recorded yet: no series to draw
	}
	t.Truncated = len(entries) >= core.TimelineLimit
	if t.Start.IsZero() || t.Truncated || entries[0].Time.Time.Before(t.Start) {
		t.Start = entries[0].Time.Time
	}
	if !t.Truncated {
		t.Members = append(t.Members, Point{At: t.Start, Value: 0})
	}
	for _, e := range entries {
		t.Events = append(t.Events, Event{At: e.Time.Time, Type: e.Type, Members: int(e.Members), Message: e.Message})
		t.Members = addPoint(t.Members, e.Time.Time, int(e.Members))
	}
	t.Members = addPoint(t.Members, t.End, int(job.Status.Members))
	t.normalize()
	return t
}

// TrainingLog is one line of a rank's training log, as internal/demo reads
// examples/digits/train.py's.
type TrainingLog struct {
	At time.Time
	// Kind is step, resume, checkpoint, stop or final; others are ignored.
	Kind string
	// Step is the line's step.
	Step int
	// World is the world size of a step or resume line; 0 when not logged.
	World int
}

// AddTraining adds what the ranks logged: the highest step over time, the
// world size training ran with, and one event per agreed stop, per
// (re)start and for the end. Every rank logs the same stop and resume, so
// repeated lines of one step count once.
func (t *Timeline) AddTraining(logs []TrainingLog) {
	t.own()
	logs = slices.Clone(logs)
	slices.SortStableFunc(logs, func(a, b TrainingLog) int { return a.At.Compare(b.At) })
	best, world := -1, -1
	// Every rank logs the same stop and resume: one event each, unless
	// training went on in between.
	lastStop, lastResume := -1, -1
	stepped, resumed := false, false
	for _, l := range logs {
		switch l.Kind {
		case "step":
			stepped = true
			if l.Step > best {
				best = l.Step
				t.Steps = append(t.Steps, Point{At: l.At, Value: l.Step})
			}
			if l.World > 0 && l.World != world {
				world = l.World
				t.World = append(t.World, Point{At: l.At, Value: world})
			}
		case "stop":
			if l.Step != lastStop || resumed {
				lastStop, resumed = l.Step, false
				t.Events = append(t.Events, Event{At: l.At, Type: TypeStopped, Members: -1, Message: fmt.Sprintf("ranks stopped at step %d", l.Step)})
			}
			if world != 0 {
				world = 0
				t.World = append(t.World, Point{At: l.At, Value: 0})
			}
		case "resume":
			if l.Step != lastResume || stepped || world == 0 {
				verb := "resumed"
				if lastResume < 0 {
					verb = "started"
				}
				msg := fmt.Sprintf("training %s at step %d", verb, l.Step)
				if l.World == 1 {
					msg += " with 1 rank"
				} else if l.World > 1 {
					msg += fmt.Sprintf(" with %d ranks", l.World)
				}
				t.Events = append(t.Events, Event{At: l.At, Type: TypeTrained, Members: -1, Message: msg})
				lastResume, stepped, resumed = l.Step, false, true
			}
			if l.World > 0 && l.World != world {
				world = l.World
				t.World = append(t.World, Point{At: l.At, Value: world})
			}
		case "final":
			t.Events = append(t.Events, Event{At: l.At, Type: TypeFinished, Members: -1, Message: fmt.Sprintf("training finished after %d steps", l.Step)})
			if world != 0 {
				world = 0
				t.World = append(t.World, Point{At: l.At, Value: 0})
			}
		}
	}
	t.normalize()
}

// AddEvent adds e (a notice the caller saw itself, for example).
func (t *Timeline) AddEvent(e Event) {
	t.own()
	t.Events = append(t.Events, e)
	t.normalize()
}

// own copies the slices before they change, so that a copy of a Timeline
// taken before stays as it was.
func (t *Timeline) own() {
	t.Members, t.World, t.Steps = slices.Clone(t.Members), slices.Clone(t.World), slices.Clone(t.Steps)
	t.Events = slices.Clone(t.Events)
}

// normalize sorts the events and widens Start and End to cover every point
// and event.
func (t *Timeline) normalize() {
	slices.SortStableFunc(t.Events, func(a, b Event) int { return a.At.Compare(b.At) })
	for _, s := range [][]Point{t.Members, t.World, t.Steps} {
		for _, p := range s {
			t.cover(p.At)
		}
	}
	for _, e := range t.Events {
		t.cover(e.At)
	}
}

func (t *Timeline) cover(at time.Time) {
	if at.IsZero() {
		return
	}
	if t.Start.IsZero() || at.Before(t.Start) {
		t.Start = at
	}
	if t.End.IsZero() || at.After(t.End) {
		t.End = at
	}
}

// addPoint appends a point unless the value stays the same.
func addPoint(s []Point, at time.Time, v int) []Point {
	if n := len(s); n > 0 && s[n-1].Value == v {
		return s
	}
	return append(s, Point{At: at, Value: v})
}

// valueAt is the series' value at time at: the last point's at or before
// it; ok is false before the first point.
func valueAt(s []Point, at time.Time) (v int, ok bool) {
	i, _ := slices.BinarySearchFunc(s, at, func(p Point, at time.Time) int {
		if p.At.After(at) {
			return 1
		}
		return -1
	})
	if i == 0 {
		return 0, false
	}
	return s[i-1].Value, true
}

// MaxValue is the series' largest value (0 for none).
func MaxValue(s []Point) int {
	m := 0
	for _, p := range s {
		m = max(m, p.Value)
	}
	return m
}
