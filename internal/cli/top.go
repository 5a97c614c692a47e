package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// TopOptions are the flags of `etjob top`.
type TopOptions struct {
	// AllNamespaces is -A/--all-namespaces.
	AllNamespaces bool
	// Once prints one frame and exits.
	Once bool
	// Interval is --interval, the time between frames.
	Interval time.Duration
	// Now is the clock (tests fix it).
	Now func() time.Time

	factory *factory
	clients *Clients
}

func newTopCommand(f *factory) *cobra.Command {
	o := &TopOptions{factory: f}
	cmd := &cobra.Command{
		Use:   "top",
		Short: "A live table of jobs: status, members/desired, restarts, preemptions, age",
		Example: f.examples(`  etjob top
  etjob top -A --once`),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Interval <= 0 {
				return fmt.Errorf("--interval %s: must be more than 0", o.Interval)
			}
			if o.Now == nil {
				o.Now = time.Now
			}
			cs, err := f.Clients()
			if err != nil {
				return err
			}
			o.clients = cs
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "show the jobs of every namespace")
	cmd.Flags().BoolVar(&o.Once, "once", false, "print one frame and exit")
	cmd.Flags().DurationVar(&o.Interval, "interval", 2*time.Second, "time between frames")
	return cmd
}

// Run prints frames until interrupted (or one with --once).
func (o *TopOptions) Run(ctx context.Context) error {
	out := o.factory.out()
	for {
		var opts []client.ListOption
		if !o.AllNamespaces {
			opts = append(opts, client.InNamespace(o.clients.Namespace))
		}
		var jobs etjobv1.ElasticJobList
		if err := o.clients.Client.List(ctx, &jobs, opts...); err != nil {
			return fmt.Errorf("listing ElasticJobs: %w", err)
		}
		if !o.Once {
			fmt.Fprint(out, "\x1b[H\x1b[2J") // home and clear, as top(1)
			fmt.Fprintf(out, "%s top - %s (every %s, Ctrl-C quits)\n\n", o.factory.prog, o.Now().Format("15:04:05"), o.Interval)
		}
		printTop(out, jobs.Items, o.AllNamespaces, o.Now())
		if o.Once {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.Interval):
		}
	}
}

// printTop prints one frame of `etjob top`.
func printTop(out io.Writer, jobs []etjobv1.ElasticJob, allNamespaces bool, now time.Time) {
	if len(jobs) == 0 {
		fmt.Fprintln(out, "No resources found")
		return
	}
	sort.Slice(jobs, func(i, j int) bool {
		if jobs[i].Namespace != jobs[j].Namespace {
			return jobs[i].Namespace < jobs[j].Namespace
		}
		return jobs[i].Name < jobs[j].Name
	})
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	if allNamespaces {
		fmt.Fprint(tw, "NAMESPACE\t")
	}
	fmt.Fprintln(tw, "NAME\tSTATUS\tMEMBERS/DESIRED\tMIN-MAX\tRESTARTS\tPREEMPTIONS\tAGE")
	for i := range jobs {
		j := &jobs[i]
		if allNamespaces {
			fmt.Fprintf(tw, "%s\t", j.Namespace)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d-%d\t%d\t%d\t%s\n", j.Name, jobStatus(j), j.Status.Members, j.Spec.Replicas,
			j.Spec.MinReplicas, j.Spec.MaxReplicas, j.Status.Restarts, j.Status.Preemptions, age(j.CreationTimestamp.Time, now))
	}
	_ = tw.Flush()
}
