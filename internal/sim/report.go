package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Options say what Compare runs beside Params.
type Options struct {
	// Params is the job and the costs (Params.Provider is the notice of the
	// first scenario, the cloud whose prices Params carries).
	Params Params
	// CheapFraction and CheapProvider make the second scenario: spot at this
	// fraction of the on-demand price, with that notice (0.10 and a 5-minute
	// notice: Alibaba's).
	CheapFraction float64
	CheapProvider Provider
	// Pauses are the resume pauses of the sensitivity runs of etjob.
	Pauses []time.Duration
	// TimeScale multiplies the trace's times (1: as recorded).
	TimeScale float64
}

// DefaultOptions are `etjob-local sim`'s defaults.
func DefaultOptions() Options {
	return Options{
		Params:        DefaultParams(),
		CheapFraction: 0.10,
		CheapProvider: Providers["alibaba"],
		Pauses:        []time.Duration{5 * time.Second, 15 * time.Second, 46 * time.Second},
		TimeScale:     1,
	}
}

// Row is a result with its ratios to on-demand.
type Row struct {
	Result
	// GoodputVsOnDemand and CostVsOnDemand: goodput and cost per committed
	// sample as fractions of the on-demand job's.
	GoodputVsOnDemand float64 `json:"goodputVsOnDemand"`
	CostVsOnDemand    float64 `json:"costPerSampleVsOnDemand"`
	// GoodputVsRestart: goodput over the better elastic checkpoint-restart
	// baseline's (checkpoint-restart or +grow: restarts at the size
	// available).
	GoodputVsRestart float64 `json:"goodputVsCheckpointRestart"`
	// GoodputVsFixed: goodput over the fixed-size checkpoint-restart
	// baseline's at its best size in hindsight (issue #6's baseline).
	GoodputVsFixed float64 `json:"goodputVsFixedSizeRestart"`
}

// Scenario is the strategies side by side under one price and notice.
type Scenario struct {
	Name          string               `json:"name"`
	SpotPrice     etjobv1.PricePerHour `json:"spotPrice"`
	OnDemandPrice etjobv1.PricePerHour `json:"onDemandPrice"`
	Rows          []Row                `json:"rows"`
}

// Goal is one target of issue #6 and whether the simulation met it.
type Goal struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Target string  `json:"target"`
	Met    bool    `json:"met"`
}

// Comparison is every strategy on one trace.
type Comparison struct {
	Trace       TraceStats `json:"trace"`
	TimeScale   float64    `json:"timeScale"`
	Params      ParamsView `json:"params"`
	Scenarios   []Scenario `json:"scenarios"`
	Sensitivity []Row      `json:"resumePauseSensitivity"`
	// FixedSizeSweep is the fixed-size baseline's goodput at every size from
	// minReplicas to replicas; FixedSize the best of them, the one its rows
	// show.
	FixedSizeSweep []SizePoint `json:"fixedSizeSweep"`
	FixedSize      int         `json:"fixedSize"`
	// FixedSizeIntervals is the fixed-size baseline's best size and goodput
	// under other rules for its checkpoint interval (FixedIntervalVariants).
	FixedSizeIntervals []FixedVariant `json:"fixedSizeIntervalSensitivity"`
	// CapacityGoodput is the most goodput any strategy of at most N workers
	// can reach on the trace: rate x the integral of min(N, nodes alive) over
	// the span, per second, with no pause and no loss.
	CapacityGoodput float64 `json:"capacityGoodput"`
	Goals           []Goal  `json:"goals"`
}

// ParamsView is Params in seconds, for reports.
type ParamsView struct {
	Replicas              int32   `json:"replicas"`
	MinReplicas           int32   `json:"minReplicas"`
	RatePerWorker         float64 `json:"ratePerWorker"`
	NoticeStop            float64 `json:"noticeStopSeconds"`
	CheckpointTime        float64 `json:"checkpointSeconds"`
	BroadcastTime         float64 `json:"broadcastSeconds"`
	StateGB               float64 `json:"stateGB"`
	NetworkGbps           float64 `json:"networkGbps"`
	StorageMBps           float64 `json:"storageMBps"`
	ResumePause           float64 `json:"resumePauseSeconds"`
	HardPause             float64 `json:"hardPauseSeconds"`
	StartDelay            float64 `json:"startDelaySeconds"`
	LeaveGrace            float64 `json:"leaveGraceSeconds"`
	CheckpointInterval    float64 `json:"checkpointIntervalSeconds"`
	MaxCheckpointInterval float64 `json:"maxCheckpointIntervalSeconds"`
}

func viewOf(p Params) ParamsView {
	return ParamsView{
		Replicas: p.Replicas, MinReplicas: p.MinReplicas, RatePerWorker: p.Rate,
		NoticeStop: p.NoticeStop.Seconds(), CheckpointTime: p.CheckpointTime.Seconds(), BroadcastTime: p.BroadcastTime.Seconds(),
		StateGB: p.StateGB, NetworkGbps: p.NetworkGbps, StorageMBps: p.StorageMBps,
		ResumePause: p.ResumePause.Seconds(), HardPause: p.HardPause.Seconds(), StartDelay: p.StartDelay.Seconds(),
		LeaveGrace: p.LeaveGrace.Seconds(), CheckpointInterval: p.CheckpointInterval.Seconds(),
		MaxCheckpointInterval: p.MaxCheckpointInterval.Seconds(),
	}
}

// Goal thresholds of issue #6.
const (
	GoalCostRatio      = 0.33
	GoalCheapCostRatio = 0.11
	GoalVsRestart      = 2.0
	// Issue #14's, with the notice's lead time used (on p3 with AWS's
	// notice, and at 10 % of on-demand with 300 s notices).
	GoalLeadCostRatio      = 0.31
	GoalLeadCheapCostRatio = 0.107
)

// Compare runs etjob, the checkpoint-restart baselines (the fixed-size one at
// its best size in hindsight, and the two elastic ones) and on-demand on the
// trace: at Params' prices and notice, and at CheapFraction of the on-demand
// price with CheapProvider's notice; then etjob at each of Pauses.
func Compare(tr *Trace, o Options) (*Comparison, error) {
	if o.TimeScale <= 0 {
		return nil, fmt.Errorf("time scale %v: must be positive", o.TimeScale)
	}
	if o.CheapFraction <= 0 || o.CheapFraction > 1 {
		return nil, fmt.Errorf("cheap fraction %v: must be in (0, 1]", o.CheapFraction)
	}
	if o.TimeScale != 1 {
		tr = tr.Scaled(o.TimeScale)
	}
	p := o.Params
	c := &Comparison{Trace: tr.Stats(), TimeScale: o.TimeScale, Params: viewOf(p)}

	restart, err := RunRestart(tr, p, false)
	if err != nil {
		return nil, err
	}
	grow, err := RunRestart(tr, p, true)
	if err != nil {
		return nil, err
	}
	fixed, sweep, err := BestRestartFixed(tr, p)
	if err != nil {
		return nil, err
	}
	c.FixedSizeSweep, c.FixedSize = sweep, fixed.FixedSize
	if c.FixedSizeIntervals, err = FixedIntervalVariants(tr, p, fixed); err != nil {
		return nil, err
	}
	if span := tr.Span(); span > 0 {
		c.CapacityGoodput = p.Rate * tr.capacitySeconds(int(p.Replicas)) / span.Seconds()
	}
	od, err := RunOnDemand(tr, p)
	if err != nil {
		return nil, err
	}
	best := max(restart.Goodput, grow.Goodput)
	row := func(r Result, od Result) Row {
		out := Row{Result: r}
		if od.Goodput > 0 {
			out.GoodputVsOnDemand = r.Goodput / od.Goodput
		}
		if od.CostPerMillion > 0 && r.CostPerMillion > 0 {
			out.CostVsOnDemand = r.CostPerMillion / od.CostPerMillion
		}
		if best > 0 {
			out.GoodputVsRestart = r.Goodput / best
		}
		if fixed.Goodput > 0 {
			out.GoodputVsFixed = r.Goodput / fixed.Goodput
		}
		return out
	}

	els, err := runElasticVariants(tr, p)
	if err != nil {
		return nil, err
	}
	rows := func(els []Result, baselines ...Result) []Row {
		var out []Row
		for _, r := range append(els, baselines...) {
			out = append(out, row(r, od))
		}
		return out
	}
	c.Scenarios = append(c.Scenarios, Scenario{
		Name:      fmt.Sprintf("spot $%.2f/h vs on-demand $%.2f/h, %s notice", float64(p.SpotPrice), float64(p.OnDemandPrice), p.Provider),
		SpotPrice: p.SpotPrice, OnDemandPrice: p.OnDemandPrice,
		Rows: rows(els, fixed, restart, grow, od),
	})

	cheap := p
	cheap.Provider = o.CheapProvider
	cheap.SpotPrice = p.OnDemandPrice * etjobv1.PricePerHour(o.CheapFraction)
	cheapEls, err := runElasticVariants(tr, cheap)
	if err != nil {
		return nil, err
	}
	sp := cheap.SpotPrice
	c.Scenarios = append(c.Scenarios, Scenario{
		Name:      fmt.Sprintf("spot at %.0f%% of on-demand ($%.3f/h), %s notice", o.CheapFraction*100, sp, o.CheapProvider),
		SpotPrice: sp, OnDemandPrice: p.OnDemandPrice,
		Rows: rows(cheapEls, fixed.AtPrice(sp), restart.AtPrice(sp), grow.AtPrice(sp), od),
	})

	for _, pause := range o.Pauses {
		q := p
		q.ResumePause = pause
		r, err := RunElastic(tr, q)
		if err != nil {
			return nil, err
		}
		c.Sensitivity = append(c.Sensitivity, row(r, od))
	}

	first, second := c.Scenarios[0].Rows[0], c.Scenarios[1].Rows[0]
	firstIn, secondIn := c.Scenarios[0].Rows[inProcessRow], c.Scenarios[1].Rows[inProcessRow]
	c.Goals = []Goal{
		{Name: "etjob cost per committed sample vs on-demand, " + c.Scenarios[0].Name, Value: first.CostVsOnDemand,
			Target: fmt.Sprintf("<= %.2f", GoalCostRatio), Met: first.CostVsOnDemand <= GoalCostRatio},
		{Name: "etjob cost per committed sample vs on-demand, " + c.Scenarios[1].Name, Value: second.CostVsOnDemand,
			Target: fmt.Sprintf("<= %.2f", GoalCheapCostRatio), Met: second.CostVsOnDemand <= GoalCheapCostRatio},
		{Name: fmt.Sprintf("etjob goodput vs checkpoint-restart (fixed size, issue #6's baseline; S = %d, the best of %d..%d in hindsight), %s notice",
			c.FixedSize, p.MinReplicas, p.Replicas, p.Provider), Value: first.GoodputVsFixed,
			Target: fmt.Sprintf(">= %.1f", GoalVsRestart), Met: first.GoodputVsFixed >= GoalVsRestart},
		{Name: "etjob goodput vs the better elastic checkpoint-restart baseline (restarts at the size available: stronger than issue #6's), " +
			p.Provider.String() + " notice", Value: first.GoodputVsRestart,
			Target: fmt.Sprintf(">= %.1f", GoalVsRestart), Met: first.GoodputVsRestart >= GoalVsRestart},
		{Name: "etjob cost per committed sample vs on-demand (issue #14), " + c.Scenarios[0].Name, Value: first.CostVsOnDemand,
			Target: fmt.Sprintf("<= %.3f", GoalLeadCostRatio), Met: first.CostVsOnDemand <= GoalLeadCostRatio},
		{Name: "etjob cost per committed sample vs on-demand (issue #14), " + c.Scenarios[1].Name, Value: second.CostVsOnDemand,
			Target: fmt.Sprintf("<= %.3f", GoalLeadCheapCostRatio), Met: second.CostVsOnDemand <= GoalLeadCheapCostRatio},
		{Name: "etjob with in-process recovery, cost per committed sample vs on-demand (issue #14), " + c.Scenarios[0].Name, Value: firstIn.CostVsOnDemand,
			Target: fmt.Sprintf("<= %.3f", GoalLeadCostRatio), Met: firstIn.CostVsOnDemand <= GoalLeadCostRatio},
		{Name: "etjob with in-process recovery, cost per committed sample vs on-demand (issue #14), " + c.Scenarios[1].Name, Value: secondIn.CostVsOnDemand,
			Target: fmt.Sprintf("<= %.3f", GoalLeadCheapCostRatio), Met: secondIn.CostVsOnDemand <= GoalLeadCheapCostRatio},
	}
	return c, nil
}

// elasticVariants are etjob's rows of every scenario, in their order: the
// job as configured, stopping at the notice, growing from a quarter, growing
// and stopping at the notice, and recovering in process.
//
// inProcessRow is the in-process variant's row, which issue #14's goals
// read too.
const inProcessRow = 4

var elasticVariants = []func(*Trace, Params) (Result, error){
	RunElastic, runElasticStop, runElasticGrow, runElasticGrowStop, runElasticInProcess,
}

// runElasticVariants runs every elastic variant under p.
func runElasticVariants(tr *Trace, p Params) ([]Result, error) {
	var out []Result
	for _, run := range elasticVariants {
		r, err := run(tr, p)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// runElasticStop is etjob whose noticed workers stop at the notice
// (noticeLeadTime Stop), the rule before issue #14.
func runElasticStop(tr *Trace, p Params) (Result, error) {
	p.NoticeLeadTime = etjobv1.NoticeLeadTimeStop
	r, err := RunElastic(tr, p)
	r.Strategy = StrategyElasticStop
	return r, err
}

// runElasticGrow is etjob with replicas a quarter of maxReplicas (at least
// min: issue #14's 8 / max 32 job), growing opportunistically to
// maxReplicas while the trace has capacity.
func runElasticGrow(tr *Trace, p Params) (Result, error) {
	p.GrowFrom = max(p.Replicas/4, p.MinReplicas)
	r, err := RunElastic(tr, p)
	r.Strategy = fmt.Sprintf(StrategyElasticGrow, p.GrowFrom, p.Replicas)
	return r, err
}

// runElasticGrowStop is runElasticGrow with noticeLeadTime Stop.
func runElasticGrowStop(tr *Trace, p Params) (Result, error) {
	p.NoticeLeadTime = etjobv1.NoticeLeadTimeStop
	r, err := runElasticGrow(tr, p)
	r.Strategy = fmt.Sprintf(StrategyElasticGrowStop, max(p.Replicas/4, p.MinReplicas), p.Replicas)
	return r, err
}

// runElasticInProcess is etjob whose workers recover in process
// (etjob.elastic): planned changes regroup without a checkpoint, and a hard
// loss does one step again.
func runElasticInProcess(tr *Trace, p Params) (Result, error) {
	p.Recovery = RecoveryInProcess
	r, err := RunElastic(tr, p)
	r.Strategy = StrategyElasticInProcess
	return r, err
}

// WriteJSON writes the comparisons as indented JSON.
func WriteJSON(w io.Writer, cs []*Comparison) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(cs)
}

// WriteTable writes a comparison as the tables of docs/benchmarks.md.
func WriteTable(w io.Writer, c *Comparison) error {
	t := c.Trace
	p := c.Params
	var b strings.Builder
	fmt.Fprintf(&b, "### %s\n\n", t.Name)
	scale := ""
	if c.TimeScale != 1 {
		scale = fmt.Sprintf(", times x%g", c.TimeScale)
	}
	fmt.Fprintf(&b, "%.2f h%s, %d adds, %d removes at %d distinct times, %.1f nodes on average (max %d). Job: %d workers (min %d), "+
		"%g samples/s per worker; state %g GB a rank (network %g Gbit/s, storage %g MB/s): checkpoint %gs, a joiner's state %gs; "+
		"resume pause %gs, hard-loss pause %gs, start %gs, notice -> stop %gs.\n\n",
		t.Span.Hours(), scale, t.Adds, t.Removes, t.RemoveTimes, t.MeanNodes, t.MaxNodes, p.Replicas, p.MinReplicas,
		p.RatePerWorker, p.StateGB, p.NetworkGbps, p.StorageMBps, p.CheckpointTime, p.BroadcastTime, p.ResumePause, p.HardPause, p.StartDelay, p.NoticeStop)
	for _, s := range c.Scenarios {
		fmt.Fprintf(&b, "%s:\n\n", capitalize(s.Name))
		b.WriteString("| strategy | notice | goodput (samples/s) | × on-demand | $ per M samples | × on-demand | time below min | losses (hard) | work lost per loss | paused | restarts (for joins only) | checkpoint every |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range s.Rows {
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.2f | %.3f | **%.3f** | %s | %d (%d) | %.0f worker-s | %s | %d (%d) | %s |\n",
				strategyName(r.Result), r.Notice, r.Goodput, r.GoodputVsOnDemand, r.CostPerMillion, r.CostVsOnDemand,
				seconds(r.BelowMinSeconds), r.Losses, r.HardLosses, r.LostPerLoss/p.RatePerWorker, seconds(r.PauseSeconds),
				r.Restarts, r.JoinRestarts, seconds(r.CheckpointSeconds))
		}
		b.WriteString("\n")
	}
	if len(c.Sensitivity) > 0 {
		b.WriteString("etjob's sensitivity to the resume pause (first scenario):\n\n")
		b.WriteString("| resume pause | goodput (samples/s) | × on-demand | $ per M samples | × on-demand | × fixed-size checkpoint-restart goodput | × better elastic checkpoint-restart goodput |\n")
		b.WriteString("|---|---|---|---|---|---|---|\n")
		for _, r := range c.Sensitivity {
			fmt.Fprintf(&b, "| %gs | %.0f | %.2f | %.3f | %.3f | %.2f | %.2f |\n", r.ResumePauseSeconds, r.Goodput, r.GoodputVsOnDemand,
				r.CostPerMillion, r.CostVsOnDemand, r.GoodputVsFixed, r.GoodputVsRestart)
		}
		b.WriteString("\n")
	}
	if len(c.FixedSizeSweep) > 0 {
		b.WriteString("Checkpoint-restart (fixed size): goodput (samples/s) by size S; the rows above use the best, S = " +
			strconv.Itoa(c.FixedSize) + ", chosen in hindsight:\n\n")
		var pts []string
		for _, s := range c.FixedSizeSweep {
			pts = append(pts, fmt.Sprintf("%d: %.0f", s.Size, s.Goodput))
		}
		b.WriteString(strings.Join(pts, ", ") + "\n\n")
	}
	if len(c.FixedSizeIntervals) > 0 && len(c.Scenarios) > 0 && len(c.Scenarios[0].Rows) > 0 {
		el := c.Scenarios[0].Rows[0]
		b.WriteString("The fixed-size baseline under other rules for its checkpoint interval (each at its best S; the trace's losses " +
			"are not a Poisson process, so where the checkpoints fall against them moves its goodput):\n\n")
		b.WriteString("| checkpoint interval | S | checkpoint every | goodput (samples/s) | etjob × it |\n")
		b.WriteString("|---|---|---|---|---|\n")
		for _, v := range c.FixedSizeIntervals {
			fmt.Fprintf(&b, "| %s | %d | %s | %.0f | %.2f |\n", v.Rule, v.Size, seconds(v.IntervalSeconds), v.Goodput, ratio(el.Goodput, v.Goodput))
		}
		b.WriteString("\n")
	}
	if c.CapacityGoodput > 0 && len(c.Scenarios) > 0 && len(c.Scenarios[0].Rows) > 0 {
		rows := c.Scenarios[0].Rows
		var fixed, elastic float64
		for _, r := range rows {
			switch r.Strategy {
			case StrategyRestartFixed:
				fixed = r.Goodput
			case StrategyRestart, StrategyRestartGrow:
				elastic = max(elastic, r.Goodput)
			}
		}
		fmt.Fprintf(&b, "Upper bound: the trace's capacity (the integral of min(%d, nodes alive), no pause, no loss) is %.0f samples/s; "+
			"etjob reaches %.0f%% of it. No strategy can exceed %.2f× the fixed-size baseline or %.2f× the better elastic one on this trace.\n\n",
			p.Replicas, c.CapacityGoodput, 100*rows[0].Goodput/c.CapacityGoodput, ratio(c.CapacityGoodput, fixed), ratio(c.CapacityGoodput, elastic))
	}
	b.WriteString("Goals:\n\n")
	for _, g := range c.Goals {
		verdict := "not met"
		if g.Met {
			verdict = "met"
		}
		fmt.Fprintf(&b, "- %s: %.3f (goal %s): **%s**\n", g.Name, g.Value, g.Target, verdict)
	}
	for _, s := range c.Scenarios {
		for _, r := range s.Rows {
			if r.NoticeUnusedSeconds > 0 {
				fmt.Fprintf(&b, "- %s, %s notice: %.0f worker-hours of notice time not trained on (workers leave at the notice, their nodes stay until the deadline)\n",
					r.Strategy, r.Notice, r.NoticeUnusedSeconds/3600)
			}
			for _, warn := range r.Warnings {
				fmt.Fprintf(&b, "- %s, %s notice: %s\n", r.Strategy, r.Notice, warn)
			}
		}
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// strategyName is a row's strategy as the table shows it: the fixed-size
// baseline with its size.
func strategyName(r Result) string {
	if r.Strategy == StrategyRestartFixed {
		return fmt.Sprintf("checkpoint-restart (fixed size, S = %d)", r.FixedSize)
	}
	return r.Strategy
}

// ratio is a / b, or 0 where b is not positive.
func ratio(a, b float64) float64 {
	if !(b > 0) {
		return 0
	}
	return a / b
}

func seconds(s float64) string {
	switch {
	case s == 0:
		return "-"
	case s >= 3600:
		return fmt.Sprintf("%.2f h", s/3600)
	case s >= 60:
		return fmt.Sprintf("%.1f min", s/60)
	default:
		return fmt.Sprintf("%.0f s", s)
	}
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
