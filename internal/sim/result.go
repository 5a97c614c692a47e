package sim

import (
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Strategy names.
const (
	StrategyElastic = "etjob"
	// StrategyElasticStop is etjob with spec.spot.noticeLeadTime Stop: a
	// noticed worker stops at the notice instead of training through it.
	StrategyElasticStop = "etjob, stops at the notice"
	// StrategyElasticGrow is etjob with replicas GrowFrom growing to
	// maxReplicas (spec.growth.policy Opportunistic).
	StrategyElasticGrow = "etjob, replicas %d, grows to %d"
	// StrategyElasticGrowStop is the growing job with noticeLeadTime Stop.
	StrategyElasticGrowStop = "etjob, replicas %d, grows to %d, stops at the notice"
	// StrategyElasticInProcess is etjob whose workers recover in process
	// (etjob.elastic, Params.Recovery).
	StrategyElasticInProcess = "etjob, in-process recovery (etjob.elastic)"
	StrategyRestart          = "checkpoint-restart"
	StrategyRestartGrow      = "checkpoint-restart+grow"
	// StrategyRestartFixed is the non-elastic checkpoint-restart job of a
	// fixed size (RunRestartFixed).
	StrategyRestartFixed = "checkpoint-restart (fixed size)"
	StrategyOnDemand     = "on-demand"
)

// Result is what one strategy achieved on one trace.
type Result struct {
	Strategy string `json:"strategy"`
	// FixedSize is the size S of the fixed-size checkpoint-restart job (0
	// for the other strategies).
	FixedSize int    `json:"fixedSize,omitempty"`
	Trace     string `json:"trace"`
	// Notice is the provider's notice as replayed ("aws 120s").
	Notice string `json:"notice"`
	// ResumePauseSeconds is the planned-change restart pause in effect.
	ResumePauseSeconds float64 `json:"resumePauseSeconds"`
	SpanSeconds        float64 `json:"spanSeconds"`
	// Samples are the committed samples at the end of the run (work rolled
	// back by a hard loss is not in it); Goodput is Samples per second.
	Samples float64 `json:"samples"`
	Goodput float64 `json:"goodput"`
	// WorkerSeconds are the worker-seconds spent training, lost work included.
	WorkerSeconds float64 `json:"workerSeconds"`
	// NodeSeconds are the node-seconds paid for, at PricePerHour per hour.
	NodeSeconds  float64              `json:"nodeSeconds"`
	PricePerHour etjobv1.PricePerHour `json:"pricePerHour"`
	Cost         float64              `json:"cost"`
	// CostPerMillion is Cost per million committed samples.
	CostPerMillion float64 `json:"costPerMillionSamples"`
	// BelowMinSeconds is the time the job did not train for want of
	// minReplicas workers (from the start of the trace).
	BelowMinSeconds float64 `json:"belowMinSeconds"`
	// Losses are removals of a node under a worker of the job: noticed (the
	// worker checkpointed and left in time) or hard.
	Losses        int `json:"losses"`
	NoticedLosses int `json:"noticedLosses"`
	HardLosses    int `json:"hardLosses"`
	// Joins are workers admitted into a running job.
	Joins int `json:"joins"`
	// LostSamples were trained and rolled back; LostPerLoss = LostSamples / Losses.
	LostSamples float64 `json:"lostSamples"`
	LostPerLoss float64 `json:"lostSamplesPerLoss"`
	// PauseSeconds is the time the job had members but did not train
	// (checkpoints, restarts).
	PauseSeconds float64 `json:"pauseSeconds"`
	// Restarts are restarts of the training processes (every membership change
	// of a torchrun job is one).
	Restarts          int     `json:"restarts"`
	Checkpoints       int     `json:"checkpoints"`
	FailedCheckpoints int     `json:"failedCheckpoints"`
	CheckpointSeconds float64 `json:"checkpointIntervalSeconds"`
	// NoticeUnusedSeconds are worker-seconds between a noticed worker's exit
	// and its node's end: notice time the job did not train on that node.
	NoticeUnusedSeconds float64 `json:"noticeUnusedWorkerSeconds,omitempty"`
	// KilledByDeletion counts workers whose pod the plan deleted while the
	// training still needed them (their leave grace period ran out).
	KilledByDeletion int `json:"killedByDeletion,omitempty"`
	// JoinRestarts are restarts for workers joining only (no one left).
	JoinRestarts int `json:"joinRestarts,omitempty"`
	// StoppedBelowMin counts workers told to stop because the job fell below
	// minReplicas (their pods are then replaced).
	StoppedBelowMin int `json:"stoppedBelowMin,omitempty"`
	// PodsCreated counts the worker pods the plans created.
	PodsCreated int `json:"podsCreated,omitempty"`
	// DecideCalls counts core.Decide calls (etjob only).
	DecideCalls int `json:"decideCalls,omitempty"`
	// Warnings are conditions and anomalies seen during the run.
	Warnings []string `json:"warnings,omitempty"`
}

// AtPrice returns the result with its cost at another price per node-hour.
func (r Result) AtPrice(price etjobv1.PricePerHour) Result {
	r.PricePerHour = price
	r.Cost = price.Cost(r.NodeSeconds / 3600)
	r.CostPerMillion = 0
	if r.Samples > 0 {
		r.CostPerMillion = r.Cost / r.Samples * 1e6
	}
	return r
}

// ledger accounts the training of one strategy: progress, the last
// checkpoint, rollbacks, pauses and the time below min.
type ledger struct {
	rate    float64
	minimum int
	// contention is Params.Contention: n workers train at
	// rate n / (1 + contention (n - 1)).
	contention float64
	// progress: samples trained and not rolled back; committed: at the last
	// checkpoint.
	progress, committed float64
	lost                float64
	workerSeconds       float64
	// belowMin: workers were asked to train below min (a bug, counted).
	belowMin     int
	checkpoints  int
	failed       int
	restarts     int
	waitSince    time.Duration
	waiting      bool
	waited       time.Duration
	pauseSince   time.Duration
	pausing      bool
	paused       time.Duration
	hard, notice int
	joins        int
	joinRestarts int
}

func (l *ledger) train(workers int, d time.Duration) {
	if d <= 0 || workers == 0 {
		return
	}
	if workers < l.minimum {
		l.belowMin++
		return
	}
	l.progress += l.throughput(workers) * d.Seconds()
	l.workerSeconds += float64(workers) * d.Seconds()
}

func (l *ledger) checkpoint() {
	l.committed = l.progress
	l.checkpoints++
}

func (l *ledger) rollback() {
	l.lost += l.progress - l.committed
	l.progress = l.committed
}

// throughput is the samples/s of n workers.
func (l *ledger) throughput(n int) float64 {
	if n <= 0 {
		return 0
	}
	return l.rate * float64(n) / (1 + l.contention*float64(n-1))
}

// rollbackStep rolls back one step of a group of workers, never past the
// last checkpoint: etjob.elastic's rollback to the in-memory commit.
func (l *ledger) rollbackStep(workers int, step time.Duration) {
	d := min(l.progress-l.committed, l.throughput(workers)*step.Seconds())
	l.lost += d
	l.progress -= d
}

// state moves the ledger's clocks: waiting (below min), pausing (members but
// no training) or neither (training).
func (l *ledger) state(now time.Duration, waiting, pausing bool) {
	if l.waiting {
		l.waited += now - l.waitSince
	}
	if l.pausing {
		l.paused += now - l.pauseSince
	}
	l.waiting, l.waitSince = waiting, now
	l.pausing, l.pauseSince = pausing, now
}

func (l *ledger) result(strategy, trace string, span time.Duration, nodeSeconds float64, price etjobv1.PricePerHour) Result {
	l.state(span, false, false)
	r := Result{
		Strategy: strategy, Trace: trace, SpanSeconds: span.Seconds(),
		Samples: l.progress, WorkerSeconds: l.workerSeconds, NodeSeconds: nodeSeconds,
		BelowMinSeconds: l.waited.Seconds(), PauseSeconds: l.paused.Seconds(),
		Losses: l.hard + l.notice, NoticedLosses: l.notice, HardLosses: l.hard, Joins: l.joins,
		LostSamples: l.lost, Restarts: l.restarts, JoinRestarts: l.joinRestarts, Checkpoints: l.checkpoints, FailedCheckpoints: l.failed,
	}
	if span > 0 {
		r.Goodput = l.progress / span.Seconds()
	}
	if r.Losses > 0 {
		r.LostPerLoss = l.lost / float64(r.Losses)
	}
	return r.AtPrice(price)
}
