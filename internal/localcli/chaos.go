package localcli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/etjob/etjob/internal/chaos"
	"github.com/etjob/etjob/internal/cli"
	"github.com/etjob/etjob/internal/localcluster"
)

type chaosOptions struct {
	seed     int64
	dir      string
	repo     string
	record   string
	replay   string
	keep     bool
	epochs   int
	width    int
	notice   time.Duration
	baseline bool
	timeout  time.Duration
	streams  cli.IOStreams
}

func newChaosCommand(streams cli.IOStreams) *cobra.Command {
	o := &chaosOptions{streams: streams}
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Run a seeded chaos schedule on a local cluster with real torchrun training, and check it",
		Long: `Starts a local cluster (6 spot + 2 on-demand process nodes), submits the digits example
(4 workers, min 2, max 6) and injects a seeded schedule of faults, each fired on training progress
or on the job's membership generation: noticed reclaims from every cloud, bursts (one below min),
hard losses, node joins, a loss during a reconfiguration, a withdrawn notice, restarts of the
etjob controller, a node agent and the kube-apiserver, the kube-apiserver down 30 s in the middle
of a scale-out, and the launcher's pod deleted with no grace period. Then it checks, from the training logs,
checkpoints, the cluster and the controller's decision record: no committed step lost on noticed
events, every sample once per epoch, monotonic generation, nothing left behind, accuracy next to an
undisturbed run, no failures. It writes a JSON-lines run record and exits non-zero on any failed check.

--replay FILE instead re-runs core.Decide on every decision of a record (<dir>/decisions.jsonl of a
run) and checks each plan is identical and the invariants hold; it needs no cluster.`,
		Example: `  etjob-local chaos --seed 42
  etjob-local chaos --replay ~/.cache/etjob/chaos/decisions.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if !c.Flags().Changed("seed") {
				o.seed = time.Now().UnixNano() % 1_000_000
			}
			return o.run(c.Context())
		},
	}
	cmd.Flags().Int64Var(&o.seed, "seed", 0, "seed of the schedule and the victims (default: drawn from the time, and printed)")
	cmd.Flags().StringVar(&o.dir, "dir", filepath.Join(filepath.Dir(localcluster.DefaultDir()), "chaos"), "directory of the chaos cluster (the run record and decision record stay there)")
	cmd.Flags().StringVar(&o.repo, "repo", "", repoFlagHelp)
	cmd.Flags().StringVar(&o.record, "record", "", "JSON-lines run record (default <dir>/chaos-run.jsonl)")
	cmd.Flags().StringVar(&o.replay, "replay", "", "replay this decision record through core.Decide and check it, instead of a run")
	cmd.Flags().BoolVar(&o.keep, "keep", false, "keep the cluster running afterwards")
	cmd.Flags().IntVar(&o.epochs, "epochs", 120, "training epochs (22 steps each); enough to outlast the schedule")
	cmd.Flags().IntVar(&o.width, "width", 96, "CNN width (work per step)")
	cmd.Flags().DurationVar(&o.notice, "notice", 8*time.Second, "reclamation notice of noticed faults")
	cmd.Flags().BoolVar(&o.baseline, "baseline", true, "run the same training undisturbed alongside, for the accuracy check")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 25*time.Minute, "give up after this long")
	return cmd
}

func (o *chaosOptions) run(ctx context.Context) error {
	if o.replay != "" {
		return o.runReplay()
	}
	repo, err := exampleRepo(o.repo)
	if err != nil {
		return err
	}
	o.repo = repo
	if o.notice <= 0 {
		return fmt.Errorf("--notice %s: want a positive notice (hard losses are part of the schedule)", o.notice)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	// Ctrl-C and SIGTERM end the run through its context, so the cluster
	// is still stopped.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	w := o.streams.Out
	fmt.Fprintf(w, "etjob-local chaos --seed %d (rerun the same schedule with this seed)\n", o.seed)
	decisions := filepath.Join(o.dir, "decisions.jsonl")
	cl := &localcluster.Cluster{Dir: o.dir, Out: w, Images: localcluster.LocalImages(o.repo, localcluster.HorovodVenv()), ControllerArgs: []string{"--record-decisions=" + decisions}}
	if cl.BinDir, err = buildControlPlane(o.streams); err != nil {
		return err
	}
	if err := cl.Delete(); err != nil {
		return err
	}
	if o.record == "" {
		o.record = filepath.Join(o.dir, "chaos-run.jsonl")
	}
	fmt.Fprintf(w, "starting a cluster in %s (6 spot + 2 on-demand nodes):\n", o.dir)
	if err := cl.Up(ctx, 6, 2); err != nil {
		return err
	}
	if !o.keep {
		defer func() {
			fmt.Fprintln(w, "stopping the cluster (--keep keeps it)")
			_ = cl.Stop()
		}()
	}
	res, err := chaos.Run(ctx, chaos.Options{Cluster: cl, RepoRoot: o.repo, Seed: o.seed, Epochs: o.epochs, Width: o.width,
		Notice: o.notice, Baseline: o.baseline, RecordPath: o.record, DecisionsPath: decisions, Out: w})
	if res != nil {
		res.Summary(w)
		fmt.Fprintf(w, "run record: %s\ndecision record: %s (etjob-local chaos --replay %s)\n", o.record, decisions, decisions)
	}
	if err != nil {
		return fmt.Errorf("chaos run (seed %d): %w", o.seed, err)
	}
	if !res.OK() {
		return fmt.Errorf("chaos run (seed %d): some checks failed", o.seed)
	}
	return nil
}

func (o *chaosOptions) runReplay() error {
	rep, err := chaos.ReplayFile(o.replay)
	if rep != nil {
		rep.Summary(o.streams.Out)
	}
	if err != nil {
		return fmt.Errorf("--replay %s: %w", o.replay, err)
	}
	if !rep.OK() {
		return fmt.Errorf("--replay %s: %d plans differ, %d invariant violations", o.replay, rep.MismatchCount, rep.ViolationCount)
	}
	return nil
}
