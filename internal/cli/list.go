package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// ListOptions are the flags of `etjob list`.
type ListOptions struct {
	// AllNamespaces is -A/--all-namespaces.
	AllNamespaces bool
	// Output is -o: "", wide, yaml or json.
	Output string
	// Now is the clock (tests fix it).
	Now func() time.Time

	factory *factory
	clients *Clients
}

func newListCommand(f *factory) *cobra.Command {
	o := &ListOptions{factory: f}
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List jobs (Arena's layout)",
		Example: f.examples(`  etjob list
  etjob list -A -o wide`),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "list the jobs of every namespace")
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "output format: wide, yaml or json")
	addTypeFlag(cmd)
	return cmd
}

// Complete connects to the cluster.
func (o *ListOptions) Complete() error {
	if o.Now == nil {
		o.Now = time.Now
	}
	cs, err := o.factory.Clients()
	o.clients = cs
	return err
}

// Validate checks the flags.
func (o *ListOptions) Validate() error {
	switch o.Output {
	case "", "wide", "yaml", "json":
		return nil
	}
	return fmt.Errorf("-o/--output %q: must be wide, yaml or json", o.Output)
}

// Run prints the jobs.
func (o *ListOptions) Run(ctx context.Context) error {
	c := o.clients.Client
	var opts []client.ListOption
	if !o.AllNamespaces {
		opts = append(opts, client.InNamespace(o.clients.Namespace))
	}
	var jobs etjobv1.ElasticJobList
	if err := c.List(ctx, &jobs, opts...); err != nil {
		return fmt.Errorf("listing ElasticJobs: %w", err)
	}
	sort.Slice(jobs.Items, func(i, j int) bool {
		a, b := jobs.Items[i], jobs.Items[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	if o.Output == "yaml" || o.Output == "json" {
		jobs.APIVersion, jobs.Kind = "v1", "List"
		for i := range jobs.Items {
			jobs.Items[i].APIVersion, jobs.Items[i].Kind = etjobv1.GroupVersion.String(), "ElasticJob"
			jobs.Items[i].ManagedFields = nil
		}
		return printObject(o.factory.out(), &jobs, o.Output)
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, append(opts, client.HasLabels{etjobv1.LabelJobName})...); err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	byJob := map[string][]corev1.Pod{}
	for _, p := range pods.Items {
		k := p.Namespace + "/" + p.Labels[etjobv1.LabelJobName]
		byJob[k] = append(byJob[k], p)
	}
	printJobList(o.factory.out(), jobs.Items, byJob, o.AllNamespaces, o.Output == "wide", o.Now())
	return nil
}

// printJobList prints Arena's `arena list` table: NAME STATUS TRAINER
// DURATION GPU(Requested) GPU(Allocated) NODE (the launcher's node); wide adds
// the elastic columns.
func printJobList(out io.Writer, jobs []etjobv1.ElasticJob, pods map[string][]corev1.Pod, allNamespaces, wide bool, now time.Time) {
	if len(jobs) == 0 {
		fmt.Fprintln(out, "No resources found")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	if allNamespaces {
		fmt.Fprint(tw, "NAMESPACE\t")
	}
	fmt.Fprint(tw, "NAME\tSTATUS\tTRAINER\tDURATION\tGPU(Requested)\tGPU(Allocated)\tNODE")
	if wide {
		fmt.Fprint(tw, "\tMEMBERS\tRANKS\tDESIRED\tRESTARTS\tPREEMPTIONS")
	}
	fmt.Fprintln(tw)
	for i := range jobs {
		j := &jobs[i]
		var requested, allocated int64
		node := ""
		for k := range pods[j.Namespace+"/"+j.Name] {
			p := &pods[j.Namespace+"/"+j.Name][k]
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			g := podGPUs(p)
			requested += g
			if p.Spec.NodeName != "" {
				allocated += g
			}
			if p.Labels[etjobv1.LabelRole] == etjobv1.RoleLauncher {
				node = p.Spec.NodeName
			}
		}
		if allNamespaces {
			fmt.Fprintf(tw, "%s\t", j.Namespace)
		}
		fmt.Fprintf(tw, "%s\t%s\tETJOB\t%s\t%d\t%d\t%s", j.Name, jobStatus(j), shortDuration(jobDuration(j, now)), requested, allocated, orNA(node))
		if wide {
			fmt.Fprintf(tw, "\t%d\t%d\t%s\t%d\t%d", j.Status.Members, ranks(j), desired(j), j.Status.Restarts, j.Status.Preemptions)
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
}

// desired is "replicas (min-max)", as the Desired column of kubectl get.
func desired(j *etjobv1.ElasticJob) string {
	return fmt.Sprintf("%d (%d-%d)", j.Spec.Replicas, j.Spec.MinReplicas, j.Spec.MaxReplicas)
}

// ranks is the job's training processes: its members times the ranks a
// worker holds (status.ranks; computed for a status written before it).
func ranks(j *etjobv1.ElasticJob) int32 {
	if j.Status.Ranks > 0 || j.Status.Members == 0 {
		return j.Status.Ranks
	}
	return j.Status.Members * max(j.Status.SlotsPerWorker, 1)
}
