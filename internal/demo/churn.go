package demo

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/etjob/etjob/internal/driver"
)

// ChurnResult holds, per event, how long the spot path took on the local
// cluster with real training (benchmarks, docs/benchmarks.md).
type ChurnResult struct {
	// NoticeToStop: reclamation requested at the node's metadata service ->
	// all ranks stopped at the agreed step (the `stop` line).
	NoticeToStop []time.Duration
	// Pause: the last step before a membership change -> the first step after.
	Pause []time.Duration
	// LostSteps per loss event.
	LostSteps []int
	// JoinToTraining: a node added -> the first step with the larger world.
	JoinToTraining []time.Duration
	// JoinLostSteps per join.
	JoinLostSteps []int
}

// Churn submits the example (4 workers, min 2, max 6) on the cluster's 4 spot
// nodes, so that no spare node is left, and then, events times: reclaims one
// member's node with the given notice (0: a hard loss), waits until training
// resumed with 3, adds a spot node and waits until training runs with 4 again.
func Churn(ctx context.Context, o Options, events int) (*ChurnResult, error) {
	s, err := newStory(o)
	if err != nil {
		return nil, err
	}
	if err := s.submitSized(ctx, 4); err != nil {
		return nil, err
	}
	if err := s.waitMembers(ctx, 4, 6*time.Minute); err != nil {
		return nil, err
	}
	out := &ChurnResult{}
	for i := range events {
		if err := s.waitSteps(ctx, s.d.MaxStep()+o.StepsBeforeLoss, 5*time.Minute); err != nil {
			return out, err
		}
		victims, err := s.workerNodes(ctx, 1)
		if err != nil {
			return out, err
		}
		lines, _ := s.d.Logs()
		before := len(driver.Resumes(lines))
		t0 := time.Now()
		s.say("event %d: reclaiming %s (notice %s)", i+1, victims[0], o.Notice)
		done := make(chan error, 1)
		go func() { done <- o.Cluster.Reclaim(ctx, victims[0], o.Notice) }()
		if err := s.waitResumes(ctx, before+1, 4*time.Minute); err != nil {
			return out, err
		}
		lines, _ = s.d.Logs()
		stop, pause, lost := measureLoss(lines, t0)
		if stop > 0 {
			out.NoticeToStop = append(out.NoticeToStop, stop)
		}
		out.Pause = append(out.Pause, pause)
		out.LostSteps = append(out.LostSteps, lost)
		s.say("event %d: notice -> stop %s, pause %s, %d steps lost", i+1, stop.Round(time.Millisecond), pause.Round(time.Millisecond), lost)
		if err := <-done; err != nil {
			return out, err
		}
		before = len(driver.Resumes(lines))
		tAdd := time.Now()
		name, err := o.Cluster.AddNode(ctx, "", true)
		if err != nil {
			return out, err
		}
		if err := s.waitWorld(ctx, 4, tAdd, 4*time.Minute); err != nil {
			return out, err
		}
		lines, _ = s.d.Logs()
		join, jlost := measureJoin(lines, tAdd, before)
		out.JoinToTraining = append(out.JoinToTraining, join)
		out.JoinLostSteps = append(out.JoinLostSteps, jlost)
		s.say("event %d: node %s added -> training with 4 workers after %s, %d steps lost", i+1, name, join.Round(time.Millisecond), jlost)
	}
	return out, nil
}

// measureLoss finds, after t0, the agreed stop (if any), the training pause
// around the restart and the steps lost.
func measureLoss(lines []driver.LogLine, t0 time.Time) (noticeToStop, pause time.Duration, lost int) {
	start := float64(t0.UnixNano()) / 1e9
	lastStep, reached := 0.0, 0
	for i, l := range lines {
		if l.T < start {
			if l.Kind == "step" {
				lastStep, reached = l.T, max(reached, l.Step)
			}
			continue
		}
		switch l.Kind {
		case "step":
			lastStep, reached = l.T, max(reached, l.Step)
		case "stop":
			if noticeToStop == 0 {
				noticeToStop = secs(l.T - start)
			}
		case "resume":
			for _, n := range lines[i+1:] {
				if n.Kind == "step" {
					return noticeToStop, secs(n.T - lastStep), max(0, reached-l.Step)
				}
			}
			return noticeToStop, 0, max(0, reached-l.Step)
		}
	}
	return noticeToStop, 0, 0
}

// measureJoin: time from tAdd to the first step with a larger world than
// before, and the steps the join's restart lost.
func measureJoin(lines []driver.LogLine, tAdd time.Time, resumesBefore int) (time.Duration, int) {
	start := float64(tAdd.UnixNano()) / 1e9
	world := 0
	for _, l := range lines {
		if l.Kind == "step" && l.T < start {
			world = l.World
		}
	}
	var join time.Duration
	for _, l := range lines {
		if l.Kind == "step" && l.T >= start && l.World > world {
			join = secs(l.T - start)
			break
		}
	}
	lost := 0
	if rs := driver.Resumes(lines); len(rs) > resumesBefore {
		lost = rs[len(rs)-1].Lost
	}
	return join, lost
}

func (s *story) waitWorld(ctx context.Context, world int, after time.Time, timeout time.Duration) error {
	start := float64(after.UnixNano()) / 1e9
	return s.d.WaitFor(ctx, fmt.Sprintf("training with %d workers", world), timeout, func() (bool, error) {
		lines, err := s.d.Logs()
		if err != nil {
			return false, err
		}
		for _, l := range lines {
			if l.Kind == "step" && l.T >= start && l.World >= world {
				return true, nil
			}
		}
		return false, nil
	})
}

func secs(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// Median returns the median of ds (0 for none).
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
