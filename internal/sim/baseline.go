package sim

import (
	"fmt"
	"slices"
	"time"
)

// Event kinds of the checkpoint-restart baseline.
const (
	bvAdd = iota
	bvGone
	bvPhase
)

// restartJob is a checkpoint-restart job with no notice handling. As the
// elastic baseline it is the job Bamboo (Thorpe et al., NSDI '23) and Oobleck
// (Jang et al., SOSP '23) measure against, as Varuna (Athlur et al., EuroSys
// '22) runs it on spot VMs: it checkpoints every Young/Daly interval; every
// loss of one of its nodes restarts the whole job from the last checkpoint, at
// the size available then (up to N; below minReplicas it waits). It does not
// grow while it runs: nodes that come are taken at the next restart, or, with
// grow, by a checkpoint and a restart as soon as they come. With lo = hi = S
// it is the classic fixed-size job of RunRestartFixed.
type restartJob struct {
	p    Params
	grow bool
	// lo and hi bound the job's size: it restarts on up to hi of the nodes
	// alive and waits while fewer than lo are (MinReplicas and Replicas; a
	// fixed-size job has lo = hi = S).
	lo, hi int
	q      queue
	now    time.Duration
	alive  []string // in the order they came
	group  []string
	phase  phase
	gen    int
	since  time.Duration
	// growing: the checkpoint in progress is for taking new nodes.
	growing  bool
	interval time.Duration
	led      ledger
	// failures counts the instants at which one or more of its nodes went.
	failures int
}

// RunRestart replays the trace with the checkpoint-restart baseline; grow
// makes it take new nodes at once (a checkpoint and a restart) instead of at
// its next restart.
func RunRestart(tr *Trace, p Params, grow bool) (Result, error) {
	if err := p.Validate(); err != nil {
		return Result{}, err
	}
	span := tr.Span()
	j := runRestart(tr, p, grow, int(p.MinReplicas), int(p.Replicas), p.youngDaly(span, tr.Stats().RemoveTimes))
	name := StrategyRestart
	if grow {
		name = StrategyRestartGrow
	}
	return j.result(tr, name), nil
}

// runRestart replays the trace with a checkpoint-restart job of lo..hi
// workers that checkpoints every interval of training.
func runRestart(tr *Trace, p Params, grow bool, lo, hi int, interval time.Duration) *restartJob {
	span := tr.Span()
	j := &restartJob{p: p, grow: grow, lo: lo, hi: hi, interval: interval, led: p.ledger()}
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
	return j
}

func (j *restartJob) result(tr *Trace, name string) Result {
	r := j.led.result(name, tr.Name, tr.Span(), tr.Stats().NodeSeconds, j.p.SpotPrice)
	r.Notice = "ignored"
	r.ResumePauseSeconds = j.p.HardPause.Seconds()
	r.CheckpointSeconds = j.interval.Seconds()
	return r
}

// RunRestartFixed replays the trace with the classic, non-elastic
// checkpoint-restart job of issue #6: a data-parallel job of exactly size
// workers that trains only while at least size trace nodes are alive. It
// checkpoints every Young/Daly interval of its own losses; every loss of one
// of its nodes rolls it back to the last checkpoint, and it restarts on size
// nodes (the hard-loss pause) as soon as that many are alive again. It never
// changes size. Its interval is sqrt(2 C M) with M its own mean time between
// losses: the time it held nodes over the instants at which it lost one,
// found by replaying until the interval no longer changes (from the elastic
// baseline's, the trace's removals), at most fixedPointRounds times. It pays
// for every trace node-hour, as the other spot strategies do.
func RunRestartFixed(tr *Trace, p Params, size int) (Result, error) {
	if err := p.Validate(); err != nil {
		return Result{}, err
	}
	if size < int(p.MinReplicas) || size > int(p.Replicas) {
		return Result{}, fmt.Errorf("fixed size %d: must be between min (%d) and replicas (%d)", size, p.MinReplicas, p.Replicas)
	}
	span := tr.Span()
	interval := p.youngDaly(span, tr.Stats().RemoveTimes)
	var r Result
	for round := 0; ; round++ {
		j := runRestart(tr, p, false, size, size, interval)
		r = j.result(tr, StrategyRestartFixed)
		held := span - time.Duration(r.BelowMinSeconds*float64(time.Second))
		next := p.youngDaly(held, j.failures)
		if next == interval || round == fixedPointRounds-1 {
			break
		}
		interval = next
	}
	r.FixedSize = size
	return r, nil
}

// fixedPointRounds bounds the replays that look for the fixed-size job's own
// Young/Daly interval.
const fixedPointRounds = 8

// SizePoint is the fixed-size baseline's goodput at one size.
type SizePoint struct {
	Size    int     `json:"size"`
	Goodput float64 `json:"goodput"`
}

// BestRestartFixed runs the fixed-size baseline at every size from
// MinReplicas to Replicas and returns the one with the most goodput (the
// smallest such size on a tie), with every size's goodput: the best size in
// hindsight, which no one running the job could know in advance.
func BestRestartFixed(tr *Trace, p Params) (Result, []SizePoint, error) {
	var best Result
	var sweep []SizePoint
	for s := int(p.MinReplicas); s <= int(p.Replicas); s++ {
		r, err := RunRestartFixed(tr, p, s)
		if err != nil {
			return Result{}, nil, err
		}
		sweep = append(sweep, SizePoint{Size: s, Goodput: r.Goodput})
		if best.FixedSize == 0 || r.Goodput > best.Goodput {
			best = r
		}
	}
	return best, sweep, nil
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
	n := min(len(j.alive), j.hi)
	if n < j.lo {
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
		j.failures++
		j.growing = false
		j.restart()
	case len(added) == 0:
	case j.phase == waiting:
		j.restart()
	case j.grow && j.phase == running && len(j.group) < min(len(j.alive), j.hi):
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
			j.led.joins += min(len(j.alive), j.hi) - len(j.group)
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
	l := p.ledger()
	l.train(int(p.Replicas), span)
	l.committed = l.progress
	r := l.result(StrategyOnDemand, tr.Name, span, n*span.Seconds(), p.OnDemandPrice)
	r.Notice = "-"
	return r, nil
}

// FixedVariant is the fixed-size baseline at its best size under one rule
// for its checkpoint interval.
type FixedVariant struct {
	Rule            string  `json:"rule"`
	Size            int     `json:"size"`
	IntervalSeconds float64 `json:"checkpointIntervalSeconds"`
	Goodput         float64 `json:"goodput"`
}

// Rules of FixedIntervalVariants.
const (
	RuleOwnLosses   = "Young/Daly of its own losses (the rows above)"
	RuleTraceWide   = "Young/Daly of all the trace's removal times (the elastic baselines' rule)"
	RuleHindsight   = "best in hindsight (10 s steps to 10 min, then 1 min steps)"
	hindsightFine   = 10 * time.Second
	hindsightCoarse = time.Minute
)

// FixedIntervalVariants shows how much the fixed-size baseline's goodput
// owes to its checkpoint interval: its best size with the interval of
// RunRestartFixed (own), with the elastic baselines' (the trace's removal
// times), and with the size and the interval both chosen in hindsight. The
// trace's failures are not a Poisson process, so where a checkpoint falls
// against the next loss moves the goodput by several percent.
func FixedIntervalVariants(tr *Trace, p Params, own Result) ([]FixedVariant, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	out := []FixedVariant{{Rule: RuleOwnLosses, Size: own.FixedSize, IntervalSeconds: own.CheckpointSeconds, Goodput: own.Goodput}}
	span := tr.Span()
	limit := p.MaxCheckpointInterval
	if limit <= 0 {
		limit = time.Hour
	}
	var candidates []time.Duration
	for d := hindsightFine; d <= limit; {
		candidates = append(candidates, d)
		if d < 10*time.Minute {
			d += hindsightFine
		} else {
			d += hindsightCoarse
		}
	}
	wide := FixedVariant{Rule: RuleTraceWide}
	hind := FixedVariant{Rule: RuleHindsight}
	for s := int(p.MinReplicas); s <= int(p.Replicas); s++ {
		iv := p.youngDaly(span, tr.Stats().RemoveTimes)
		if g := runRestart(tr, p, false, s, s, iv).result(tr, StrategyRestartFixed).Goodput; wide.Size == 0 || g > wide.Goodput {
			wide = FixedVariant{Rule: RuleTraceWide, Size: s, IntervalSeconds: iv.Seconds(), Goodput: g}
		}
		for _, iv := range candidates {
			if g := runRestart(tr, p, false, s, s, iv).result(tr, StrategyRestartFixed).Goodput; hind.Size == 0 || g > hind.Goodput {
				hind = FixedVariant{Rule: RuleHindsight, Size: s, IntervalSeconds: iv.Seconds(), Goodput: g}
			}
		}
	}
	return append(out, wide, hind), nil
}
