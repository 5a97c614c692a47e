package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/timeline"
)

// GetOptions are the flags and argument of `etjob get NAME`.
type GetOptions struct {
	// Name is the job's name.
	Name string
	// Output is -o: "", wide, yaml or json.
	Output string
	// Events is -e/--events: also print the job's and its pods' events.
	Events bool
	// Timeline is --timeline: print the job's timeline (a chart of its
	// members over time and its events, from status.timeline) instead.
	Timeline bool
	// Now is the clock (tests fix it).
	Now func() time.Time

	factory *factory
	clients *Clients
}

func newGetCommand(f *factory) *cobra.Command {
	o := &GetOptions{factory: f}
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a job: Arena's layout, plus why it waits, its membership timeline, checkpoint and restarts",
		Example: f.examples(`  etjob get elastic-training
  etjob get elastic-training -e
  etjob get elastic-training --timeline
  etjob get elastic-training -o yaml`),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: f.completeJobNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Complete(args); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "output format: wide, yaml or json")
	cmd.Flags().BoolVarP(&o.Events, "events", "e", false, "also print the events of the job and its pods")
	cmd.Flags().BoolVar(&o.Timeline, "timeline", false, "print the job's timeline instead: members over time with its notices, leaves, joins, suspends and resumes marked, then the events")
	addTypeFlag(cmd)
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"wide", "yaml", "json"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// addTypeFlag accepts Arena's --type etjob (the only type here).
func addTypeFlag(cmd *cobra.Command) {
	cmd.Flags().String("type", "etjob", "Arena's job type; etjob is the only one here")
	_ = cmd.Flags().MarkHidden("type")
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if t, _ := c.Flags().GetString("type"); t != "etjob" && t != "et" {
			return fmt.Errorf("--type %q: etjob only knows etjob jobs (ElasticJobs)", t)
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}

// Complete fills the options from the command line.
func (o *GetOptions) Complete(args []string) error {
	o.Name = args[0]
	if o.Now == nil {
		o.Now = time.Now
	}
	cs, err := o.factory.Clients()
	o.clients = cs
	return err
}

// Validate checks the flags.
func (o *GetOptions) Validate() error {
	if o.Timeline && (o.Output != "" || o.Events) {
		return fmt.Errorf("--timeline prints a chart and the job's timeline events: it does not combine with -o/--output or -e/--events")
	}
	switch o.Output {
	case "", "wide", "yaml", "json":
		return nil
	}
	return fmt.Errorf("-o/--output %q: must be wide, yaml or json", o.Output)
}

// Run prints the job.
func (o *GetOptions) Run(ctx context.Context) error {
	c := o.clients.Client
	var job etjobv1.ElasticJob
	if err := c.Get(ctx, client.ObjectKey{Namespace: o.clients.Namespace, Name: o.Name}, &job); err != nil {
		return fmt.Errorf("getting %s in namespace %s: %w", jobRef(o.Name), o.clients.Namespace, err)
	}
	if o.Timeline {
		_, err := io.WriteString(o.factory.out(), timeline.FromStatus(&job, o.Now()).Text(0))
		return err
	}
	if o.Output == "yaml" || o.Output == "json" {
		job.APIVersion, job.Kind = etjobv1.GroupVersion.String(), "ElasticJob"
		job.ManagedFields = nil
		return printObject(o.factory.out(), &job, o.Output)
	}
	pods, err := jobPods(ctx, c, &job)
	if err != nil {
		return err
	}
	var events []corev1.Event
	if o.Events {
		if events, err = jobEvents(ctx, c, &job, pods); err != nil {
			return err
		}
	}
	printJob(o.factory.out(), &job, pods, events, o.Output == "wide", o.Now())
	return nil
}

// jobPods lists the job's pods (launcher first, then workers by index).
func jobPods(ctx context.Context, c client.Client, job *etjobv1.ElasticJob) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := c.List(ctx, &list, client.InNamespace(job.Namespace), client.MatchingLabels{etjobv1.LabelJobName: job.Name}); err != nil {
		return nil, fmt.Errorf("listing the pods of %s: %w", jobRef(job.Name), err)
	}
	pods := list.Items
	sort.SliceStable(pods, func(i, j int) bool {
		ri, rj := pods[i].Labels[etjobv1.LabelRole], pods[j].Labels[etjobv1.LabelRole]
		if ri != rj {
			return ri == etjobv1.RoleLauncher
		}
		ii, _ := strconv.Atoi(pods[i].Labels[etjobv1.LabelWorkerIndex])
		ij, _ := strconv.Atoi(pods[j].Labels[etjobv1.LabelWorkerIndex])
		if ii != ij {
			return ii < ij
		}
		return pods[i].Name < pods[j].Name
	})
	return pods, nil
}

func jobEvents(ctx context.Context, c client.Client, job *etjobv1.ElasticJob, pods []corev1.Pod) ([]corev1.Event, error) {
	var list corev1.EventList
	if err := c.List(ctx, &list, client.InNamespace(job.Namespace)); err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	names := map[string]bool{job.Name: true}
	for _, p := range pods {
		names[p.Name] = true
	}
	out := []corev1.Event{}
	for _, e := range list.Items {
		io := e.InvolvedObject
		if (io.Kind == "ElasticJob" && io.Name == job.Name) || (io.Kind == "Pod" && names[io.Name]) {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return eventTime(out[i]).Before(eventTime(out[j])) })
	return out, nil
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// jobStatus is Arena's STATUS: RUNNING, PENDING, SUCCEEDED, FAILED, plus
// SUSPENDED and RESTARTING, which Arena never had.
func jobStatus(job *etjobv1.ElasticJob) string {
	c := job.Status.Conditions
	switch {
	case meta.IsStatusConditionTrue(c, etjobv1.ConditionComplete):
		return "SUCCEEDED"
	case meta.IsStatusConditionTrue(c, etjobv1.ConditionFailed):
		return "FAILED"
	}
	if s := meta.FindStatusCondition(c, etjobv1.ConditionSuspended); s != nil && s.Status == "True" {
		if s.Reason == etjobv1.ReasonUserSuspended {
			return "SUSPENDED"
		}
		return "PENDING" // waiting for capacity, whatever its launcher is doing
	}
	// From the Running condition, not from status.summary's words (the
	// core's column for people, which may change).
	switch r := meta.FindStatusCondition(c, etjobv1.ConditionRunning); {
	case r == nil:
	case r.Status == "True":
		return "RUNNING"
	case r.Reason == etjobv1.ReasonRestarting:
		return "RESTARTING"
	}
	return "PENDING"
}

// waitingReason is why the job is not training: the Suspended condition's
// message when true, else the Running condition's when false.
func waitingReason(job *etjobv1.ElasticJob) string {
	c := job.Status.Conditions
	if meta.IsStatusConditionTrue(c, etjobv1.ConditionComplete) || meta.IsStatusConditionTrue(c, etjobv1.ConditionFailed) {
		for _, t := range []string{etjobv1.ConditionFailed, etjobv1.ConditionComplete} {
			if s := meta.FindStatusCondition(c, t); s != nil && s.Status == "True" && s.Message != "" {
				return s.Message
			}
		}
		return ""
	}
	if s := meta.FindStatusCondition(c, etjobv1.ConditionSuspended); s != nil && s.Status == "True" {
		return firstNonEmpty(s.Message, s.Reason)
	}
	if s := meta.FindStatusCondition(c, etjobv1.ConditionCreateRefused); s != nil && s.Status == "True" {
		return firstNonEmpty(s.Message, s.Reason)
	}
	if s := meta.FindStatusCondition(c, etjobv1.ConditionRunning); s != nil && s.Status != "True" {
		return firstNonEmpty(s.Message, s.Reason)
	}
	if len(c) == 0 {
		return "the controller has not looked at the job yet"
	}
	return ""
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// duration is how long the job has run: from its (last) start, else its
// creation, to its completion or now.
func jobDuration(job *etjobv1.ElasticJob, now time.Time) time.Duration {
	start := job.CreationTimestamp.Time
	if job.Status.StartTime != nil {
		start = job.Status.StartTime.Time
	}
	end := now
	if job.Status.CompletionTime != nil {
		end = job.Status.CompletionTime.Time
	}
	if start.IsZero() || end.Before(start) {
		return 0
	}
	return end.Sub(start)
}

// shortDuration formats as Arena does: 45s, 3m, 2h, 5d, 1y.
func shortDuration(d time.Duration) string {
	switch s := int64(d.Seconds()); {
	case s < 0:
		return "<invalid>"
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm", s/60)
	case s < 86400:
		return fmt.Sprintf("%dh", s/3600)
	case s < 86400*365:
		return fmt.Sprintf("%dd", s/86400)
	default:
		return fmt.Sprintf("%dy", s/(86400*365))
	}
}

func age(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "N/A"
	}
	return shortDuration(now.Sub(t))
}

func podGPUs(p *corev1.Pod) int64 {
	var n int64
	for _, c := range p.Spec.Containers {
		if q, ok := c.Resources.Limits[etjobv1.ResourceGPU]; ok {
			n += q.Value()
		}
	}
	return n
}

// podStatus is the pod's phase, or Terminating while it is being deleted.
func podStatus(p *corev1.Pod) string {
	if p.DeletionTimestamp != nil {
		return "Terminating"
	}
	if p.Status.Phase == "" {
		return "Pending"
	}
	return string(p.Status.Phase)
}

func orNA(s string) string {
	if s == "" {
		return "N/A"
	}
	return s
}

// printJob prints Arena's `arena get` layout, then what Arena never had.
func printJob(out io.Writer, job *etjobv1.ElasticJob, pods []corev1.Pod, events []corev1.Event, wide bool, now time.Time) {
	st := &job.Status
	priority := job.Spec.WorkerTemplate.Spec.PriorityClassName
	fmt.Fprintf(out, "Name:        %s\n", job.Name)
	fmt.Fprintf(out, "Status:      %s\n", jobStatus(job))
	fmt.Fprintf(out, "Namespace:   %s\n", job.Namespace)
	fmt.Fprintf(out, "Priority:    %s\n", orNA(priority))
	fmt.Fprintf(out, "Trainer:     ETJOB\n")
	fmt.Fprintf(out, "Duration:    %s\n", shortDuration(jobDuration(job, now)))
	fmt.Fprintf(out, "Framework:   %s", job.Spec.Framework)
	if job.Spec.Recovery == etjobv1.RecoveryInProcess {
		fmt.Fprintf(out, ", recovers in process")
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "Workers:     %d members, %d desired (min %d, max %d)", st.Members, job.Spec.Replicas, job.Spec.MinReplicas, job.Spec.MaxReplicas)
	if st.SlotsPerWorker > 1 {
		fmt.Fprintf(out, ", %d ranks (%d a worker)", ranks(job), st.SlotsPerWorker)
	}
	if st.Training != nil {
		fmt.Fprintf(out, ", %d training", *st.Training)
	}
	if st.LeavingReplicas > 0 {
		fmt.Fprintf(out, ", %d leaving", st.LeavingReplicas)
	}
	fmt.Fprintln(out)
	if st.Membership.Generation > 0 {
		fmt.Fprintf(out, "Membership:  generation %d", st.Membership.Generation)
		if st.Membership.ChangeTime != nil {
			fmt.Fprintf(out, ", changed %s ago", age(st.Membership.ChangeTime.Time, now))
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintf(out, "Restarts:    %d", st.Restarts)
	if st.LauncherReplacements > 0 {
		plural := "s"
		if st.LauncherReplacements == 1 {
			plural = ""
		}
		fmt.Fprintf(out, " (%d launcher replacement%s, the workers training on)", st.LauncherReplacements, plural)
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "Preemptions: %d\n", st.Preemptions)
	fmt.Fprintf(out, "Failures:    %d of backoffLimit %d\n", st.Failures, core.BackoffLimit(&job.Spec))
	if cp := st.LastCheckpoint; cp != nil {
		fmt.Fprintf(out, "Checkpoint:  step %d", cp.Step)
		if cp.Path != "" {
			fmt.Fprintf(out, ", %s", strings.TrimSuffix(job.Spec.CheckpointDir, "/")+"/"+cp.Path)
		}
		if cp.Time != nil {
			fmt.Fprintf(out, " (%s ago)", age(cp.Time.Time, now))
		}
		fmt.Fprintln(out)
	} else if job.Spec.CheckpointDir != "" {
		fmt.Fprintf(out, "Checkpoint:  none yet (in %s)\n", job.Spec.CheckpointDir)
	}
	if c := st.Cost; c != nil && c.Cost != "" {
		fmt.Fprintf(out, "Cost:        $%s for %s worker-hours", trimDecimal(c.Cost, 4), trimDecimal(c.WorkerHours, 3))
		if c.OnDemandCost != "" {
			fmt.Fprintf(out, " (on demand: $%s)", trimDecimal(c.OnDemandCost, 4))
		}
		fmt.Fprintln(out)
	}
	if r := waitingReason(job); r != "" {
		fmt.Fprintf(out, "Reason:      %s\n", r)
	}

	fmt.Fprintf(out, "\nInstances:\n")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	states := map[string]etjobv1.WorkerStatus{}
	for _, w := range st.Workers {
		states[w.Name] = w
	}
	if wide {
		fmt.Fprintln(tw, "  NAME\tSTATUS\tAGE\tIS_CHIEF\tGPU(Requested)\tNODE\tMEMBER_STATE\tIP")
		fmt.Fprintln(tw, "  ----\t------\t---\t--------\t--------------\t----\t------------\t--")
	} else {
		fmt.Fprintln(tw, "  NAME\tSTATUS\tAGE\tIS_CHIEF\tGPU(Requested)\tNODE")
		fmt.Fprintln(tw, "  ----\t------\t---\t--------\t--------------\t----")
	}
	for i := range pods {
		p := &pods[i]
		chief := p.Labels[etjobv1.LabelRole] == etjobv1.RoleLauncher
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%t\t%d\t%s", p.Name, podStatus(p), age(p.CreationTimestamp.Time, now), chief, podGPUs(p), orNA(p.Spec.NodeName))
		if wide {
			state := "-"
			if w, ok := states[p.Name]; ok {
				state = string(w.State)
				if w.Reason != "" {
					state += " (" + w.Reason + ")"
				}
			}
			fmt.Fprintf(tw, "\t%s\t%s", state, orNA(p.Status.PodIP))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()

	if len(st.Timeline) > 0 {
		fmt.Fprintf(out, "\nTimeline:\n")
		tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  AGE\tEVENT\tGENERATION\tMEMBERS\tMESSAGE")
		for _, e := range st.Timeline {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\n", age(e.Time.Time, now), e.Type, e.Generation, e.Members, e.Message)
		}
		_ = tw.Flush()
	}
	if events != nil {
		fmt.Fprintf(out, "\nEvents:\n")
		tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  AGE\tTYPE\tREASON\tOBJECT\tMESSAGE")
		for _, e := range events {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s/%s\t%s\n", age(eventTime(e), now), e.Type, e.Reason, strings.ToLower(e.InvolvedObject.Kind), e.InvolvedObject.Name, strings.TrimSpace(e.Message))
		}
		_ = tw.Flush()
	}
}

// trimDecimal rounds a decimal string of status.cost to digits places.
func trimDecimal(s string, digits int) string {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return s
	}
	return strconv.FormatFloat(f, 'f', digits, 64)
}
