package localcli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/etjob/etjob/internal/cli"
	"github.com/etjob/etjob/internal/sim"
)

// SimOptions are the flags of `etjob-local sim`.
type SimOptions struct {
	// Traces are the --trace files.
	Traces []string
	// Provider is --provider: whose notice window the removals get.
	Provider string
	// Notice is --notice: the notice window, overriding the provider's.
	Notice time.Duration
	// CheapProvider is --cheap-provider: the notice of the cheap scenario.
	CheapProvider string
	// Format is --format: table or json.
	Format string
	// Options are what the simulation runs with.
	Options sim.Options
	// Now is the clock that times the replay (tests fix it).
	Now func() time.Time

	noticeSet         bool
	checkpointTimeSet bool
	streams           cli.IOStreams
}

func newSimCommand(streams cli.IOStreams) *cobra.Command {
	o := &SimOptions{streams: streams, Options: sim.DefaultOptions(), Now: time.Now}
	p := &o.Options.Params
	cmd := &cobra.Command{
		Use:   "sim --trace FILE [--trace FILE...]",
		Short: "Replay spot availability traces through etjob's decision core and compare it with checkpoint-restart and on-demand",
		Long: `Replay spot availability traces (ms,add|remove,node) in a discrete-event simulation: the same
decision core as the controller (core.Decide) plans, its plans are applied to a model of the cluster
(pods created, bound to free spot nodes, ready after --start-delay; leave signals; node notices as the
agent sets them; graceful exits; node losses), and a training model on top counts committed samples.
A removal at T is the node gone at T; its notice arrives --notice earlier. Beside etjob it runs a
checkpoint-restart baseline (Young/Daly interval, whole-job restart on every loss) and N on-demand
nodes, at --spot-price and at --cheap-fraction of the on-demand price with --cheap-provider's notice,
and etjob at every --sensitivity resume pause. Runs in well under a second per trace.`,
		Example: `  etjob-local sim --trace traces/ec2-p3-trace.csv --trace traces/ec2-g4dn-trace.csv
  etjob-local sim --trace traces/ec2-p3-trace.csv --provider gcp --checkpoint-time 20s --format json
  etjob-local sim --trace traces/ec2-p3-trace.csv --time-scale 0.5   # the same trace at twice the churn`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.noticeSet = cmd.Flags().Changed("notice")
			o.checkpointTimeSet = cmd.Flags().Changed("checkpoint-time")
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run()
		},
	}
	f := cmd.Flags()
	d := sim.DefaultOptions()
	f.StringArrayVar(&o.Traces, "trace", nil, "a trace file (ms,add|remove,node); repeat for several")
	f.StringVar(&o.Provider, "provider", "aws", "whose notice the removals get: "+strings.Join(sim.ProviderNames(), ", "))
	f.DurationVar(&o.Notice, "notice", 0, "notice window before each removal, overriding --provider's (0: every removal is a hard loss)")
	f.Int32Var(&p.MinReplicas, "min", d.Params.MinReplicas, "the job's minReplicas: below it no strategy trains")
	f.Int32Var(&p.Replicas, "replicas", d.Params.Replicas, "the job's replicas and maxReplicas (N), and the on-demand job's nodes")
	f.Float64Var(&o.Options.TimeScale, "time-scale", d.TimeScale, "multiply the trace's times by this (0.5: twice the churn); notices and pauses are not scaled")
	f.DurationVar(&p.ResumePause, "pause", d.Params.ResumePause, "etjob's resume pause after a planned membership change (measured 1.48s at p50)")
	f.DurationVar(&p.HardPause, "hard-pause", d.Params.HardPause, "pause after a hard loss, and the checkpoint-restart baseline's restart (measured 19.7s)")
	f.DurationVar(&p.CheckpointTime, "checkpoint-time", d.Params.CheckpointTime, "time to write one checkpoint (default: --state-gb at --storage-mbps, plus the per-GB cost measured here)")
	f.Float64Var(&p.StateGB, "state-gb", d.Params.StateGB, "the state (model and optimizer) of one rank, GB: sets the join's broadcast and the checkpoint's time")
	f.Float64Var(&p.NetworkGbps, "network-gbps", d.Params.NetworkGbps, "the nodes' network bandwidth, Gbit/s (a joiner's state is broadcast at it)")
	f.Float64Var(&p.StorageMBps, "storage-mbps", d.Params.StorageMBps, "the checkpoint storage's write rate, MB/s")
	f.DurationVar(&p.CheckpointInterval, "checkpoint-interval", 0, "periodic checkpoint interval; 0: Young/Daly sqrt(2 C MTBF) of the losses each strategy cannot see coming")
	f.DurationVar(&p.MaxCheckpointInterval, "max-checkpoint-interval", d.Params.MaxCheckpointInterval, "cap of the Young/Daly interval")
	f.DurationVar(&p.StartDelay, "start-delay", d.Params.StartDelay, "a worker bound to a new node until it is ready")
	f.DurationVar(&p.NoticeStop, "notice-stop", d.Params.NoticeStop, "a notice until every rank stopped at the agreed step (measured 0.41s at p50)")
	f.DurationVar(&p.LeaveGrace, "leave-grace", d.Params.LeaveGrace, "the job's spec.spot.leaveGracePeriodSeconds (whole seconds)")
	f.Float64Var(&p.Rate, "rate", d.Params.Rate, "samples per second per worker (every strategy trains at rate x workers)")
	f.Float64Var((*float64)(&p.SpotPrice), "spot-price", float64(d.Params.SpotPrice), "spot $ per node-hour (p3.2xlarge, Bamboo's)")
	f.Float64Var((*float64)(&p.OnDemandPrice), "on-demand-price", float64(d.Params.OnDemandPrice), "on-demand $ per node-hour (p3.2xlarge)")
	f.Float64Var(&o.Options.CheapFraction, "cheap-fraction", d.CheapFraction, "the second scenario's spot price as a fraction of on-demand")
	f.StringVar(&o.CheapProvider, "cheap-provider", "alibaba", "the second scenario's notice (alibaba: 5 minutes)")
	f.DurationSliceVar(&o.Options.Pauses, "sensitivity", d.Pauses, "resume pauses to rerun etjob with")
	f.StringVar(&o.Format, "format", "table", "output: table (markdown) or json")
	return cmd
}

// Complete resolves the providers.
func (o *SimOptions) Complete() error {
	prov, ok := sim.Providers[o.Provider]
	if !ok {
		return fmt.Errorf("--provider %q: not one of %s", o.Provider, strings.Join(sim.ProviderNames(), ", "))
	}
	if o.noticeSet {
		if o.Notice < 0 {
			return fmt.Errorf("--notice %s: must be 0 or more", o.Notice)
		}
		prov = prov.WithNotice(o.Notice)
	}
	o.Options.Params.Provider = prov
	// the join and the checkpoint follow --state-gb and the bandwidths;
	// --checkpoint-time, when given, wins
	given := o.Options.Params.CheckpointTime
	o.Options.Params = o.Options.Params.StateCosts()
	if o.checkpointTimeSet {
		o.Options.Params.CheckpointTime = given
	}
	cheap, ok := sim.Providers[o.CheapProvider]
	if !ok {
		return fmt.Errorf("--cheap-provider %q: not one of %s", o.CheapProvider, strings.Join(sim.ProviderNames(), ", "))
	}
	o.Options.CheapProvider = cheap
	return nil
}

// Validate names the flag that is wrong.
func (o *SimOptions) Validate() error {
	p := &o.Options.Params
	switch {
	case len(o.Traces) == 0:
		return fmt.Errorf("--trace is required: a file of ms,add|remove,node lines, such as traces/ec2-p3-trace.csv")
	case o.Format != "table" && o.Format != "json":
		return fmt.Errorf("--format %q: must be table or json", o.Format)
	case p.Replicas < 1:
		return fmt.Errorf("--replicas %d: must be at least 1", p.Replicas)
	case p.MinReplicas < 1 || p.MinReplicas > p.Replicas:
		return fmt.Errorf("--min %d: must be between 1 and --replicas (%d)", p.MinReplicas, p.Replicas)
	case !(o.Options.TimeScale > 0):
		return fmt.Errorf("--time-scale %v: must be positive", o.Options.TimeScale)
	case !(p.Rate > 0):
		return fmt.Errorf("--rate %v: must be positive", p.Rate)
	case p.SpotPrice < 0:
		return fmt.Errorf("--spot-price %v: must be 0 or more", p.SpotPrice)
	case !(p.OnDemandPrice > 0):
		return fmt.Errorf("--on-demand-price %v: must be positive", p.OnDemandPrice)
	case !(o.Options.CheapFraction > 0 && o.Options.CheapFraction <= 1):
		return fmt.Errorf("--cheap-fraction %v: must be more than 0 and at most 1", o.Options.CheapFraction)
	case !(p.StateGB > 0) || !(p.NetworkGbps > 0) || !(p.StorageMBps > 0):
		return fmt.Errorf("--state-gb %v, --network-gbps %v, --storage-mbps %v: each must be positive", p.StateGB, p.NetworkGbps, p.StorageMBps)
	case p.LeaveGrace < 0 || p.LeaveGrace%time.Second != 0:
		return fmt.Errorf("--leave-grace %s: must be whole seconds, 0 or more", p.LeaveGrace)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--pause", p.ResumePause}, {"--hard-pause", p.HardPause}, {"--checkpoint-time", p.CheckpointTime},
		{"--checkpoint-interval", p.CheckpointInterval}, {"--max-checkpoint-interval", p.MaxCheckpointInterval},
		{"--start-delay", p.StartDelay}, {"--notice-stop", p.NoticeStop},
	} {
		if d.v < 0 {
			return fmt.Errorf("%s %s: must be 0 or more", d.flag, d.v)
		}
	}
	for _, s := range o.Options.Pauses {
		if s < 0 {
			return fmt.Errorf("--sensitivity %s: pauses must be 0 or more", s)
		}
	}
	return p.Validate()
}

// Run replays every trace and prints the comparison.
func (o *SimOptions) Run() error {
	start := o.Now()
	var cs []*sim.Comparison
	simulated := time.Duration(0)
	for _, path := range o.Traces {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("--trace %s: %w", path, err)
		}
		tr, err := sim.ParseTrace(filepath.Base(path), f)
		_ = f.Close()
		if err != nil {
			return fmt.Errorf("--trace %s: %w", path, err)
		}
		c, err := sim.Compare(tr, o.Options)
		if err != nil {
			return err
		}
		simulated += c.Trace.Span
		cs = append(cs, c)
	}
	wall := o.Now().Sub(start)
	if o.Format == "json" {
		if err := sim.WriteJSON(o.streams.Out, cs); err != nil {
			return err
		}
		fmt.Fprintf(o.streams.ErrOut, "replayed %.1f h of traces in %s\n", simulated.Hours(), wall.Round(time.Millisecond))
		return nil
	}
	for _, c := range cs {
		if err := sim.WriteTable(o.streams.Out, c); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(o.streams.Out, "Replayed %.1f h of traces in %s.\n", simulated.Hours(), wall.Round(time.Millisecond))
	return err
}
