package localcli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/etjob/etjob/internal/cli"
	"github.com/etjob/etjob/internal/demo"
	"github.com/etjob/etjob/internal/localcluster"
)

type demoOptions struct {
	dir      string
	repo     string
	keep     bool
	epochs   int
	width    int
	notice   time.Duration
	baseline bool
	churn    int
	hard     bool
	streams  cli.IOStreams
}

func newDemoCommand(streams cli.IOStreams) *cobra.Command {
	o := &demoOptions{streams: streams}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the spot story on a local cluster with real torchrun training",
		Long: `Starts a local cluster (4 spot + 1 on-demand process nodes), submits the digits example
(4 workers, min 2, max 6), reclaims one spot node with a notice, then two more at once (below
min: the job checkpoints and waits), adds capacity back, lets the job grow and finish, and prints
the membership timeline, steps lost per event, accuracy next to an undisturbed run, wall time and
cost next to all-on-demand. Watch it with: KUBECONFIG=$(etjob-local cluster kubeconfig --dir DIR)
kubectl get etjob,pods -w`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error { return o.run(c.Context()) },
	}
	cmd.Flags().StringVar(&o.dir, "dir", filepath.Join(filepath.Dir(localcluster.DefaultDir()), "demo"), "directory of the demo cluster")
	cmd.Flags().StringVar(&o.repo, "repo", "", repoFlagHelp)
	cmd.Flags().BoolVar(&o.keep, "keep", false, "keep the cluster running afterwards")
	cmd.Flags().IntVar(&o.epochs, "epochs", 40, "training epochs (22 steps each)")
	cmd.Flags().IntVar(&o.width, "width", 160, "CNN width (work per step)")
	cmd.Flags().DurationVar(&o.notice, "notice", 30*time.Second, "reclamation notice of each reclaimed node")
	cmd.Flags().BoolVar(&o.baseline, "baseline", true, "run the same training undisturbed beside the job, for the accuracy comparison")
	cmd.Flags().IntVar(&o.churn, "churn", 0, "instead of the story, measure N loss-and-join events (4 workers on 4 spot nodes) and print medians")
	cmd.Flags().BoolVar(&o.hard, "hard", false, "with --churn: hard losses (no notice) instead of noticed ones")
	return cmd
}

func (o *demoOptions) run(ctx context.Context) error {
	repo, err := exampleRepo(o.repo)
	if err != nil {
		return err
	}
	o.repo = repo
	cl := &localcluster.Cluster{Dir: o.dir, Out: o.streams.Out, Images: localcluster.LocalImages(o.repo, localcluster.HorovodVenv())}
	fmt.Fprintln(o.streams.Out, "control plane binaries (built once from the Go module proxy; cold ~7 min):")
	if cl.BinDir, err = buildControlPlane(o.streams); err != nil {
		return err
	}
	// A fresh cluster: the story counts nodes and steps from zero.
	if err := cl.Delete(); err != nil {
		return err
	}
	fmt.Fprintf(o.streams.Out, "starting a cluster in %s (4 spot + 1 on-demand nodes):\n", o.dir)
	if err := cl.Up(ctx, 4, 1); err != nil {
		return err
	}
	fmt.Fprintf(o.streams.Out, "watch it in another terminal: KUBECONFIG=%s kubectl get etjob,pods -o wide -w\n", cl.Kubeconfig())
	if !o.keep {
		defer func() {
			fmt.Fprintln(o.streams.Out, "stopping the cluster (--keep keeps it)")
			_ = cl.Stop()
		}()
	}
	if o.churn > 0 {
		return o.runChurn(ctx, cl)
	}
	res, err := demo.Run(ctx, demo.Options{
		Cluster: cl, RepoRoot: o.repo, Namespace: "default", Job: "digits",
		Epochs: o.epochs, Width: o.width, Notice: o.notice, StepsBeforeLoss: 60, Baseline: o.baseline, Out: o.streams.Out,
	})
	if res != nil {
		res.Summary(o.streams.Out)
	}
	return err
}

func (o *demoOptions) runChurn(ctx context.Context, cl *localcluster.Cluster) error {
	notice := o.notice
	if o.hard {
		notice = 0
	}
	r, err := demo.Churn(ctx, demo.Options{
		Cluster: cl, RepoRoot: o.repo, Namespace: "default", Job: "churn",
		Epochs: o.epochs * 4, Width: o.width, Notice: notice, StepsBeforeLoss: 40, Out: o.streams.Out,
	}, o.churn)
	if r != nil {
		w := o.streams.Out
		fmt.Fprintf(w, "\n=== churn: %d events, notice %s ===\n", len(r.Pause), notice)
		fmt.Fprintf(w, "notice -> all ranks stopped (median): %s  %v\n", demo.Median(r.NoticeToStop).Round(time.Millisecond), r.NoticeToStop)
		fmt.Fprintf(w, "training pause around a loss (median): %s  %v\n", demo.Median(r.Pause).Round(time.Millisecond), r.Pause)
		fmt.Fprintf(w, "steps lost per loss: %v\n", r.LostSteps)
		fmt.Fprintf(w, "node added -> training with it (median): %s  %v\n", demo.Median(r.JoinToTraining).Round(time.Millisecond), r.JoinToTraining)
		fmt.Fprintf(w, "steps lost per join: %v\n", r.JoinLostSteps)
	}
	return err
}

// exampleRepo returns the etjob repository whose examples/ and python/ the
// local-cluster stories run: --repo, else the current git work tree.
func exampleRepo(repo string) (string, error) {
	if repo != "" {
		if !isExampleRepo(repo) {
			return "", fmt.Errorf("--repo %s: not the etjob repository (no examples/digits/train.py)", repo)
		}
		return repo, nil
	}
	// The current git work tree, then the repository this binary was
	// built into (make build and make demo put it in <repo>/bin/).
	if out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output(); err == nil {
		if top := strings.TrimSpace(string(out)); isExampleRepo(top) {
			return top, nil
		}
	}
	if exe, err := os.Executable(); err == nil {
		if exe, err = filepath.EvalSymlinks(exe); err == nil {
			if top := filepath.Dir(filepath.Dir(exe)); isExampleRepo(top) {
				return top, nil
			}
		}
	}
	return "", fmt.Errorf("cannot find the etjob repository (examples/ and python/), neither from the current directory nor from this binary: " +
		"pass --repo DIR; the cluster's pods run etjob's library and examples from it")
}

// repoFlagHelp is the help of the --repo flags.
const repoFlagHelp = "the etjob repository (examples/ and python/, what the pods run); default: the current git work tree, else the one this binary was built in"

// isExampleRepo reports whether dir holds etjob's examples.
func isExampleRepo(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "examples/digits/train.py"))
	return err == nil
}
