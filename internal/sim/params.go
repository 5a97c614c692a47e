package sim

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/instancetype"
)

// Provider is a cloud's reclamation notice as the simulator replays it: the
// notice of a node removed at T arrives at T-Window, and the node's pods are
// killed at T-Window+Usable (GKE gives pods ~15 s of GCP's 30 s); the node is
// paid for until T.
type Provider struct {
	Name   string
	Window time.Duration
	Usable time.Duration
	// ProviderIDPrefix is the scheme of the Node's spec.providerID, from which
	// the decision core tells the cloud (and its notice window) apart.
	ProviderIDPrefix string
}

// Recovery is how a simulated job's workers take a membership change.
type Recovery string

const (
	// RecoveryRestart: every change restarts the training processes from a
	// checkpoint (etjob.torchrun); a hard loss rolls back to the last one.
	RecoveryRestart Recovery = ""
	// RecoveryInProcess: the survivors regroup in their processes
	// (etjob.elastic); a planned change writes no checkpoint, a joiner gets
	// the state by broadcast, and a hard loss does the step in flight again.
	// Below min the job still stops at a checkpoint.
	RecoveryInProcess Recovery = "in-process"
)

// Providers are the clouds with their documented notice windows,
// the decision core's (core.NoticeWindows). "none" replays every removal as a
// hard loss.
var Providers = map[string]Provider{
	"alibaba": provider("alibaba", "alicloud://"),
	"aws":     provider("aws", "aws://"),
	"azure":   provider("azure", "azure://"),
	"gcp":     provider("gcp", "gce://"),
	"none":    {Name: "none"},
}

func provider(name, idPrefix string) Provider {
	n := core.NoticeWindows[name]
	return Provider{Name: name, Window: n.Window, Usable: n.Usable, ProviderIDPrefix: idPrefix}
}

// ProviderNames lists the known providers, sorted.
func ProviderNames() []string {
	var out []string
	for n := range Providers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// WithNotice returns the provider with its notice window (and usable part)
// replaced by d: an explicit --notice.
func (p Provider) WithNotice(d time.Duration) Provider {
	p.Window, p.Usable = d, d
	return p
}

// String is how reports name the notice: "aws 120s", "gcp 30s (15s usable)".
func (p Provider) String() string {
	if p.Window <= 0 {
		return p.Name + " (no notice)"
	}
	if p.Usable != p.Window {
		return fmt.Sprintf("%s %gs (%gs usable)", p.Name, p.Window.Seconds(), p.Usable.Seconds())
	}
	return fmt.Sprintf("%s %gs", p.Name, p.Window.Seconds())
}

// Params are the job's shape and the measured costs the simulation uses. The
// defaults (DefaultParams) come from docs/benchmarks.md; every strategy uses
// the same training model, so the ratios between strategies do not depend on
// the absolute rate.
type Params struct {
	// Replicas is the job's desired and maximum size N.
	Replicas int32
	// MinReplicas: below it a job does not train (it waits for capacity).
	MinReplicas int32
	// Rate is samples per second per worker: the job trains Rate x workers.
	Rate float64
	// Provider says when notices arrive.
	Provider Provider
	// NoticeStop is notice -> all ranks stopped at the agreed step (0.41 s
	// measured at p50); training goes on until then.
	NoticeStop time.Duration
	// CheckpointTime is the time to write one checkpoint (training is stopped
	// meanwhile). A notice shorter than NoticeStop+CheckpointTime is a hard loss.
	CheckpointTime time.Duration
	// ResumePause is a planned membership change's restart: from the
	// checkpoint written to the first step with the new membership (1.48 s
	// measured at p50 with etjob.torchrun's forkserver and expected-size
	// rounds, whose own checkpoint was ~0 s; 6.9 s before them).
	ResumePause time.Duration
	// HardPause is a hard loss: the node gone -> the survivors train again from
	// the last periodic checkpoint (19.7 s measured, torch's heartbeat expiry
	// included). The checkpoint-restart baseline restarts with it too.
	HardPause time.Duration
	// StartDelay is a worker's pod bound to a new node -> ready (the rest of
	// the measured 4.77 s node-added -> trains is NoticeStop + ResumePause).
	StartDelay time.Duration
	// LeaveGrace is spec.spot.leaveGracePeriodSeconds of the simulated job.
	LeaveGrace time.Duration
	// NoticeLeadTime is spec.spot.noticeLeadTime of the simulated job: Train
	// (or empty) trains through a notice until deadline - (checkpoint time +
	// StopMargin), Stop stops at the notice.
	NoticeLeadTime etjobv1.NoticeLeadTime
	// GrowFrom, when set, makes the job one of replicas GrowFrom and
	// maxReplicas Replicas under spec.growth.policy Opportunistic: extra
	// workers above GrowFrom while the trace has capacity (issue #14's 8 /
	// max 32 job). 0: replicas = maxReplicas = Replicas.
	GrowFrom int32
	// StopMargin is spec.spot.stopMarginSeconds (whole seconds).
	StopMargin time.Duration
	// Contention makes throughput sublinear: n workers train at Rate x n /
	// (1 + Contention (n - 1)) (0: linear, the default). MinGainPerWorker
	// is the growing job's spec.growth.minSamplesPerSecondPerWorker (0:
	// off); the workers report their throughput and size with each
	// checkpoint, as the examples do.
	Contention       float64
	MinGainPerWorker int64
	// Recovery is how the workers take a membership change: RecoveryRestart
	// (etjob.torchrun, the default) or RecoveryInProcess (etjob.elastic).
	Recovery Recovery
	// RegroupPause is etjob.elastic's new generation in the same processes:
	// the rendezvous in the store and a new gloo group (0.31 s measured at
	// p50 for a join by make bench-faults, the state's broadcast included,
	// which is ~0 for its small CNN).
	RegroupPause time.Duration
	// BroadcastTime is a joiner's state sent by a survivor: StateGB at
	// NetworkGbps plus etjob.elastic's own cost per GB, measured
	// (StateCosts).
	BroadcastTime time.Duration
	// StateGB is the state (model and optimizer) one rank holds, NetworkGbps
	// the nodes' network and StorageMBps the checkpoint storage's write
	// rate: StateCosts derives BroadcastTime and CheckpointTime from them
	// and the per-GB costs measured here (SyncSecondsPerGB,
	// SaveSecondsPerGB).
	StateGB     float64
	NetworkGbps float64
	StorageMBps float64
	// InProcessHardPause is a hard loss under etjob.elastic: the peer's
	// closed connections seen, the generation ended, the survivors regrouped
	// (0.88 s measured at p50 by make bench-faults); StepTime, the step in
	// flight, is done again.
	InProcessHardPause time.Duration
	StepTime           time.Duration
	// CheckpointInterval is the periodic checkpoint interval (training time);
	// 0 picks Young/Daly's sqrt(2 C MTBF) for each strategy from the failures
	// it cannot see coming, capped at MaxCheckpointInterval.
	CheckpointInterval time.Duration
	// MaxCheckpointInterval bounds the Young/Daly interval: a job still
	// checkpoints this often against failures no notice announces.
	MaxCheckpointInterval time.Duration
	// SpotPrice and OnDemandPrice are $ per node-hour.
	SpotPrice     etjobv1.PricePerHour
	OnDemandPrice etjobv1.PricePerHour
	// CheckInvariants checks every plan of the decision core against the
	// running invariant and the plan rules (tests turn it on).
	CheckInvariants bool
}

// SyncSecondsPerGB and SaveSecondsPerGB are etjob.elastic's own costs per GB
// of state, beyond the time its bytes take on the network or to storage,
// measured at 1 GB a rank by python/tests/test_heavy.py on this project's
// 2-core machines (docs/benchmarks.md). The sync's is its whole time on
// loopback (the header, the chunks' packing and gloo's copies), so a model
// that adds the network's time to it errs on the slow side; the save's is
// the write's time less its pacing (etjob.stateio's serialisation and the
// fsync).
const (
	SyncSecondsPerGB = 3.05
	SaveSecondsPerGB = 2.4
)

// StateCosts sets BroadcastTime and CheckpointTime from StateGB,
// NetworkGbps and StorageMBps (each must be positive; it changes nothing
// otherwise).
func (p Params) StateCosts() Params {
	if !(p.StateGB > 0 && p.NetworkGbps > 0 && p.StorageMBps > 0) {
		return p
	}
	secs := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)).Round(time.Millisecond) }
	p.BroadcastTime = secs(p.StateGB*8/p.NetworkGbps + p.StateGB*SyncSecondsPerGB)
	p.CheckpointTime = secs(p.StateGB*1000/p.StorageMBps + p.StateGB*SaveSecondsPerGB)
	return p
}

// DefaultParams are the defaults of `etjob-local sim`.
//
// MinReplicas 8 = N/4: a data-parallel job keeps its global batch by gradient
// accumulation, and 4 micro-steps per worker is where that stops being cheap;
// it is also below the p3 trace's floor (10 nodes), so on p3 the job shrinks
// and grows but never waits, while g4dn (1-24 nodes) makes it wait.
//
// StateGB 4: a BERT-large-sized state with Adam, the size of model that
// data-parallel training on single-V100 p3.2xlarge nodes runs, saved to
// shared storage at 400 MB/s and sent to a joiner at the p3.2xlarge's 10
// Gbit/s, plus the per-GB costs measured here (StateCosts).
func DefaultParams() Params {
	return Params{
		Replicas:              32,
		MinReplicas:           8,
		Rate:                  100,
		Provider:              Providers["aws"],
		NoticeStop:            410 * time.Millisecond,
		StateGB:               4,
		NetworkGbps:           10,
		StorageMBps:           400,
		ResumePause:           1480 * time.Millisecond,
		HardPause:             19700 * time.Millisecond,
		StartDelay:            2880 * time.Millisecond,
		LeaveGrace:            30 * time.Second,
		NoticeLeadTime:        etjobv1.NoticeLeadTimeTrain,
		StopMargin:            15 * time.Second,
		RegroupPause:          310 * time.Millisecond,
		InProcessHardPause:    880 * time.Millisecond,
		StepTime:              time.Second,
		MaxCheckpointInterval: time.Hour,
		SpotPrice:             instancetype.P32xlarge.SpotPrice,
		OnDemandPrice:         instancetype.P32xlarge.OnDemandPrice,
	}.StateCosts()
}

// Validate names the first parameter that cannot be simulated.
func (p *Params) Validate() error {
	var errs []string
	if p.Replicas < 1 {
		errs = append(errs, fmt.Sprintf("replicas %d: must be at least 1", p.Replicas))
	}
	if p.GrowFrom != 0 && (p.GrowFrom < p.MinReplicas || p.GrowFrom > p.Replicas) {
		errs = append(errs, fmt.Sprintf("grow from %d: must be between min (%d) and replicas (%d)", p.GrowFrom, p.MinReplicas, p.Replicas))
	}
	if p.MinReplicas < 1 || p.MinReplicas > p.Replicas {
		errs = append(errs, fmt.Sprintf("min %d: must be between 1 and replicas (%d)", p.MinReplicas, p.Replicas))
	}
	if !(p.Rate > 0) || math.IsInf(p.Rate, 0) {
		errs = append(errs, fmt.Sprintf("rate %v: must be positive", p.Rate))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"notice stop", p.NoticeStop}, {"checkpoint time", p.CheckpointTime}, {"resume pause", p.ResumePause},
		{"hard pause", p.HardPause}, {"start delay", p.StartDelay}, {"leave grace", p.LeaveGrace}, {"stop margin", p.StopMargin},
		{"regroup pause", p.RegroupPause}, {"broadcast time", p.BroadcastTime}, {"in-process hard pause", p.InProcessHardPause},
		{"step time", p.StepTime}, {"checkpoint interval", p.CheckpointInterval}, {"max checkpoint interval", p.MaxCheckpointInterval},
		{"notice window", p.Provider.Window}, {"usable notice", p.Provider.Usable},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Sprintf("%s %s: must be 0 or more", d.name, d.v))
		}
	}
	if p.StateGB < 0 || p.NetworkGbps < 0 || p.StorageMBps < 0 || math.IsNaN(p.StateGB+p.NetworkGbps+p.StorageMBps) {
		errs = append(errs, fmt.Sprintf("state %v GB, network %v Gbit/s, storage %v MB/s: must be 0 or more", p.StateGB, p.NetworkGbps, p.StorageMBps))
	}
	if p.Provider.Usable > p.Provider.Window {
		errs = append(errs, fmt.Sprintf("usable notice %s: must not exceed the notice window %s", p.Provider.Usable, p.Provider.Window))
	}
	if p.LeaveGrace%time.Second != 0 {
		errs = append(errs, fmt.Sprintf("leave grace %s: must be whole seconds (spec.spot.leaveGracePeriodSeconds)", p.LeaveGrace))
	}
	if p.StopMargin%time.Second != 0 {
		errs = append(errs, fmt.Sprintf("stop margin %s: must be whole seconds (spec.spot.stopMarginSeconds)", p.StopMargin))
	}
	if l := p.NoticeLeadTime; l != "" && l != etjobv1.NoticeLeadTimeTrain && l != etjobv1.NoticeLeadTimeStop {
		errs = append(errs, fmt.Sprintf("notice lead time %q: must be Train or Stop", l))
	}
	if p.Recovery != RecoveryRestart && p.Recovery != RecoveryInProcess {
		errs = append(errs, fmt.Sprintf("recovery %q: must be empty (restart) or %q", p.Recovery, RecoveryInProcess))
	}
	if p.Contention < 0 || math.IsInf(p.Contention, 0) || math.IsNaN(p.Contention) || p.MinGainPerWorker < 0 {
		errs = append(errs, fmt.Sprintf("contention %v and min gain per worker %d: must be 0 or more", p.Contention, p.MinGainPerWorker))
	}
	if p.SpotPrice < 0 || p.OnDemandPrice < 0 {
		errs = append(errs, "prices must be 0 or more")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// ledger is a strategy's empty ledger under these parameters.
func (p *Params) ledger() ledger {
	return ledger{rate: p.Rate, minimum: int(p.MinReplicas), contention: p.Contention}
}

// hardLoss reports whether a removal with this provider's notice is a hard
// loss: the ranks cannot stop (and, restarting, write a checkpoint) before
// the pods die.
func (p *Params) hardLoss() bool {
	if p.Recovery == RecoveryInProcess {
		return p.Provider.Usable < p.NoticeStop
	}
	return p.Provider.Usable < p.NoticeStop+p.CheckpointTime
}

// youngDaly is the first-order optimum periodic checkpoint interval,
// sqrt(2 C M) (Young, CACM 1974; Daly, FGCS 2006), for checkpoint time C and
// mean time between failures M, capped at MaxCheckpointInterval; no failures
// (failures == 0) gives the cap.
func (p *Params) youngDaly(span time.Duration, failures int) time.Duration {
	if p.CheckpointInterval > 0 {
		return p.CheckpointInterval
	}
	limit := p.MaxCheckpointInterval
	if limit <= 0 {
		limit = time.Duration(math.MaxInt64)
	}
	if failures == 0 {
		return limit
	}
	mtbf := span.Seconds() / float64(failures)
	tau := time.Duration(math.Sqrt(2*p.CheckpointTime.Seconds()*mtbf) * float64(time.Second))
	return max(min(tau, limit), time.Second)
}
