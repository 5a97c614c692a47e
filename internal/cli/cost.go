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

// CostOptions are the flags and arguments of `etjob cost`.
type CostOptions struct {
	// Names are the jobs; none means every job of the namespace.
	Names []string
	// OnDemandPrice is --on-demand-price, the hourly on-demand price used
	// where the bill knew none for a row's instance type.
	OnDemandPrice etjobv1.PricePerHour

	factory *factory
	clients *Clients
}

func newCostCommand(f *factory) *cobra.Command {
	o := &CostOptions{factory: f}
	cmd := &cobra.Command{
		Use:   "cost [NAME...]",
		Short: "Worker-hours and cost by capacity type, next to the on-demand equivalent (the controller's bill, status.cost)",
		Long: `Worker-hours of each job by capacity type (spot or on-demand) and node price (the node label
etjob.dev/price-per-hour), the on-demand equivalent at the on-demand price of the same instance type
(or --on-demand-price where none is known), and the share saved. It reads the bill the controller
keeps in status.cost, which counts every worker pod the job ran, deleted ones too, and survives
controller restarts; it is brought up to date with every status write and at least every 5 minutes.
A job whose controller has not billed it yet says so.`,
		Example: f.examples(`  etjob cost digits
  etjob cost --on-demand-price 3.06`),
		ValidArgsFunction: f.completeJobNamesMulti,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Names = args
			if o.OnDemandPrice < 0 {
				return fmt.Errorf("--on-demand-price %v: must be 0 or more", o.OnDemandPrice)
			}
			cs, err := f.Clients()
			if err != nil {
				return err
			}
			o.clients = cs
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().Float64Var((*float64)(&o.OnDemandPrice), "on-demand-price", 0, "hourly on-demand price when the cluster has no on-demand node of the instance type")
	return cmd
}

// Run prints the cost of each job.
func (o *CostOptions) Run(ctx context.Context) error {
	c := o.clients.Client
	ns := o.clients.Namespace
	var jobs []etjobv1.ElasticJob
	if len(o.Names) == 0 {
		var list etjobv1.ElasticJobList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return fmt.Errorf("listing ElasticJobs: %w", err)
		}
		jobs = list.Items
		sort.Slice(jobs, func(i, j int) bool { return jobs[i].Name < jobs[j].Name })
	}
	for _, name := range o.Names {
		var j etjobv1.ElasticJob
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &j); err != nil {
			return fmt.Errorf("getting %s in namespace %s: %w", jobRef(name), ns, err)
		}
		jobs = append(jobs, j)
	}
	out := o.factory.out()
	if len(jobs) == 0 {
		fmt.Fprintln(out, "No resources found")
		return nil
	}
	for i := range jobs {
		if i > 0 {
			fmt.Fprintln(out)
		}
		c, ok := StatusCost(&jobs[i], o.OnDemandPrice)
		if !ok {
			fmt.Fprintf(out, "Job %s/%s: no bill yet (status.cost): the controller has not written the job's status\n", jobs[i].Namespace, jobs[i].Name)
			continue
		}
		printCost(out, c)
	}
	return nil
}

// CostRow is the worker time of one capacity type at one price.
type CostRow struct {
	// Capacity is spot, on-demand or unknown (the node is gone).
	Capacity string
	// PricePerHour is the node price (0 when unknown).
	PricePerHour etjobv1.PricePerHour
	// Hours are worker-hours.
	Hours float64
	// OnDemandPrice is the on-demand price of the same instance type (0 when
	// unknown).
	OnDemandPrice etjobv1.PricePerHour
}

// Cost is the controller's bill of one job's worker pods (status.cost): the
// one bill, computed by the decision core.
type Cost struct {
	// Job is namespace/name.
	Job string
	// Rows are the bill's, in its order.
	Rows []CostRow
	// Since is the time of the controller's bill (status.cost.time).
	Since time.Time
}

// StatusCost is the controller's bill of the job (status.cost), with
// onDemandPrice where it knew no on-demand price; ok is false without one.
func StatusCost(job *etjobv1.ElasticJob, onDemandPrice etjobv1.PricePerHour) (Cost, bool) {
	b := job.Status.Cost
	if b == nil || b.Time == nil {
		return Cost{}, false
	}
	c := Cost{Job: job.Namespace + "/" + job.Name, Since: b.Time.Time}
	for _, r := range b.Rows {
		row := CostRow{Capacity: r.CapacityType, Hours: float64(r.Milliseconds) / float64(time.Hour/time.Millisecond), OnDemandPrice: onDemandPrice}
		if row.Capacity == "" {
			row.Capacity = "unknown"
		}
		row.PricePerHour, _ = etjobv1.ParsePricePerHour(r.PricePerHour)
		if p, err := etjobv1.ParsePricePerHour(r.OnDemandPricePerHour); err == nil && p > 0 {
			row.OnDemandPrice = p
		}
		c.Rows = append(c.Rows, row)
	}
	return c, true
}

func printCost(out io.Writer, c Cost) {
	fmt.Fprintf(out, "Job %s: the controller's bill, every worker pod the job ran, up to %s\n", c.Job, c.Since.UTC().Format(time.RFC3339))
	if len(c.Rows) == 0 {
		fmt.Fprintln(out, "  no worker has run yet")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  CAPACITY\tPRICE/HOUR\tWORKER-HOURS\tCOST")
	var hours, total, onDemand float64
	knownOD := true
	for _, r := range c.Rows {
		price := "N/A"
		if r.PricePerHour > 0 {
			price = fmt.Sprintf("%.4f", float64(r.PricePerHour))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%.3f\t%.4f\n", r.Capacity, price, r.Hours, r.PricePerHour.Cost(r.Hours))
		hours += r.Hours
		total += r.PricePerHour.Cost(r.Hours)
		onDemand += r.OnDemandPrice.Cost(r.Hours)
		if r.OnDemandPrice == 0 {
			knownOD = false
		}
	}
	fmt.Fprintf(tw, "  total\t\t%.3f\t%.4f\n", hours, total)
	_ = tw.Flush()
	if !knownOD || onDemand == 0 {
		fmt.Fprintln(out, "  On-demand equivalent: N/A (no on-demand node of the instance type has a price; give --on-demand-price)")
		return
	}
	fmt.Fprintf(out, "  On-demand equivalent: %.4f\n", onDemand)
	fmt.Fprintf(out, "  Saved:                %.1f%%\n", 100*(onDemand-total)/onDemand)
}
