package demo

import (
	"path/filepath"
	"strconv"
	"strings"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/driver"
	"github.com/etjob/etjob/internal/timeline"
	"github.com/etjob/etjob/internal/timeline/chart"
)

// writeTimeline draws the run into <cluster dir>/timeline.png (issue #6)
// and says where. A drawing that fails is said, not returned: the run's
// result stands without its picture.
func (s *story) writeTimeline(lines []driver.LogLine) {
	path := filepath.Join(s.Cluster.Dir, "timeline.png")
	if err := chart.SavePNG(path, s.runTimeline(lines, time.Now())); err != nil {
		s.say("could not draw the timeline: %v", err)
		return
	}
	s.say("timeline: %s", path)
}

// runTimeline is the run as the job's status recorded it, with what the
// ranks logged and the reclamations the story made: status.timeline has no
// entry for a notice itself, only for the leave after it.
func (s *story) runTimeline(lines []driver.LogLine, now time.Time) timeline.Timeline {
	tl := timeline.Timeline{Job: s.Job}
	if s.res.Job != nil {
		tl = timeline.FromStatus(s.res.Job, now)
	}
	tl.AddTraining(trainingLogs(lines))
	s.mu.Lock()
	said := append([]string(nil), s.res.Timeline...)
	s.mu.Unlock()
	for _, n := range notices(s.start, said) {
		tl.AddEvent(n)
	}
	return tl
}

// trainingLogs turns the ranks' log lines into the timeline's.
func trainingLogs(lines []driver.LogLine) []timeline.TrainingLog {
	out := make([]timeline.TrainingLog, 0, len(lines))
	for _, l := range lines {
		out = append(out, timeline.TrainingLog{At: time.Unix(0, int64(l.T*1e9)).UTC(), Kind: l.Kind, Step: l.Step, World: l.World})
	}
	return out
}

// notices reads the reclamations back from the story's lines ("%6.1fs
// reclaiming ...", see say), as seconds after start.
func notices(start time.Time, said []string) []timeline.Event {
	var out []timeline.Event
	for _, line := range said {
		secs, what, ok := strings.Cut(strings.TrimSpace(line), "s  ")
		if !ok || !strings.Contains(what, "reclaiming ") {
			continue
		}
		f, err := strconv.ParseFloat(secs, 64)
		if err != nil {
			continue
		}
		out = append(out, timeline.Event{At: start.Add(time.Duration(f * float64(time.Second))), Type: etjobv1.TimelineNotice, Members: -1, Message: what})
	}
	return out
}
