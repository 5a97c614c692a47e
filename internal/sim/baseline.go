package sim

import (
	"slices"
	"time"
)

// Event kinds of the checkpoint-restart baseline.
const (
	bvAdd = iota
	bvGone
	bvPhase
)

// restartJob is the checkpoint-restart baseline: a fixed-size job with no
// notice handling, the one Bamboo (Thorpe et al., NSDI '23) and Oobleck (Jang
// et al., SOSP '23) measure against, as Varuna (Athlur et al., EuroSys '22)
// runs it on spot VMs. It checkpoints every Young/Daly interval; every loss
// of one of its nodes restarts the whole job from the last checkpoint, at the
// size available then (up to N; below minReplicas it waits). It does not grow
// while it runs: nodes that come are taken at the next restart, or, with
// grow, by a checkpoint and a restart as soon as they come.
type restartJob struct {
	p     Params
	grow  bool
	q     queue
	now   time.Duration
	alive []string // in the order they came
	group []string
	phase phase
	gen   int
	since time.Duration
	// growing: the checkpoint in progress is for taking new nodes.
	growing  bool
	interval time.Duration
	led      ledger
}

// RunRestart replays the trace with the checkpoint-restart baseline; grow
// makes it take new nodes at once (a checkpoint and a restart) instead of at
// its next restart.
func RunRestart(tr *Trace, p Params, grow bool) (Result, error) {
	if err := p.Validate(); err != nil {
		return Result{}, err
	}
	span := tr.Span()
	j := &restartJob{p: p, grow: grow, led: ledger{rate: p.Rate, minimum: int(p.MinReplicas)}}
	j.interval = p.youngDaly(span, tr.Stats().RemoveTimes)
	j.led.state(0, true, false)
	for _, e := range tr.Events {
		kind := bvGone
		if e.Add {
			kind = bvAdd
		}
		j.q.push(e.At, kind, e.Node, 0)
	}
	for j.q.Len() > 0 {
		at := j.q.peek().at
		if at >= span {
			break
		}
		j.now = at
		// The events of one instant act together: a job restarted by the
		// first of 18 nodes that come at once would run on one.
		var added, gone []string
		phaseDue := false
		for j.q.Len() > 0 && j.q.peek().at == at {
			e := j.q.next()
			switch e.kind {
			case bvAdd:
				added = append(added, e.name)
			case bvGone:
				gone = append(gone, e.name)
			case bvPhase:
				phaseDue = phaseDue || e.gen == j.gen
			}
		}
		if phaseDue {
			j.phaseEnd()
		}
		j.change(added, gone)
	}
	j.accrue(span)
	name := StrategyRestart
	if grow {
		name = StrategyRestartGrow
	}
	r := j.led.result(name, tr.Name, span, tr.Stats().NodeSeconds, p.SpotPrice)
	r.Notice = "ignored"
	r.ResumePauseSeconds = p.HardPause.Seconds()
	r.CheckpointSeconds = j.interval.Seconds()
	return r, nil
}

func (j *restartJob) until(at time.Duration) {
	j.gen++
	j.q.push(at, bvPhase, "", j.gen)
}

func (j *restartJob) enter(ph phase) {
	j.phase = ph
	j.led.state(j.now, ph == waiting, ph == restarting || ph == checkpointing)
}

func (j *restartJob) accrue(now time.Duration) {
	if j.phase == running {
		j.led.train(len(j.group), now-j.since)
	}
	j.since = now
}

// restart launches the job on the nodes alive now, up to N.
func (j *restartJob) restart() {
	n := min(len(j.alive), int(j.p.Replicas))
	if n < int(j.p.MinReplicas) {
		j.group = nil
		j.gen++
		j.enter(waiting)
		return
	}
	j.led.restarts++
	j.group = slices.Clone(j.alive[:n])
	j.enter(restarting)
	j.until(j.now + j.p.HardPause)
}

// change takes the nodes that came and went at one instant: a loss of one of
// the job's nodes restarts it from the last checkpoint; new nodes start a
// waiting job, or (grow) make a running one checkpoint and restart larger.
func (j *restartJob) change(added, gone []string) {
	j.alive = append(j.alive, added...)
	hit := 0
	for _, node := range gone {
		j.alive = slices.DeleteFunc(j.alive, func(s string) bool { return s == node })
		if slices.Contains(j.group, node) {
			hit++
		}
	}
	switch {
	case hit > 0:
		j.accrue(j.now)
		if j.phase == checkpointing {
			j.led.failed++
		}
		if j.phase == running || j.phase == checkpointing {
			j.led.rollback()
		}
		j.led.hard += hit
		j.growing = false
		j.restart()
	case len(added) == 0:
	case j.phase == waiting:
		j.restart()
	case j.grow && j.phase == running && len(j.group) < min(len(j.alive), int(j.p.Replicas)):
		j.accrue(j.now)
		j.growing = true
		j.enter(checkpointing)
		j.until(j.now + j.p.CheckpointTime)
	}
}

func (j *restartJob) phaseEnd() {
	switch j.phase {
	case restarting:
		j.enter(running)
		j.since = j.now
		j.until(j.now + j.interval)
	case running:
		j.accrue(j.now)
		j.enter(checkpointing)
		j.until(j.now + j.p.CheckpointTime)
	case checkpointing:
		j.led.checkpoint()
		if j.growing {
			j.growing = false
			j.led.joins += min(len(j.alive), int(j.p.Replicas)) - len(j.group)
			j.restart()
			return
		}
		j.enter(running)
		j.since = j.now
		j.until(j.now + j.interval)
	}
}

// RunOnDemand is N on-demand nodes for the whole span: no losses, no
// checkpoints counted; the upper bound of every strategy's committed work.
func RunOnDemand(tr *Trace, p Params) (Result, error) {
	if err := p.Validate(); err != nil {
		return Result{}, err
	}
	span := tr.Span()
	n := float64(p.Replicas)
	l := ledger{rate: p.Rate, minimum: int(p.MinReplicas)}
	l.train(int(p.Replicas), span)
	l.committed = l.progress
	r := l.result(StrategyOnDemand, tr.Name, span, n*span.Seconds(), p.OnDemandPrice)
	r.Notice = "-"
	return r, nil
}
