package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
)

// Scale verbs.
const (
	verbScale    = "scale"
	verbScaleOut = "scaleout"
	verbScaleIn  = "scalein"
)

// ScaleOptions are the flags and argument of `etjob scale`, `etjob scaleout`
// and `etjob scalein`. `scale` writes spec.replicas through the /scale
// subresource; `scaleout` and `scalein` create ScaleOut / ScaleIn requests,
// whose reconciler does (spec.replicas is the one desired size; docs/api.md).
type ScaleOptions struct {
	// Verb is scale, scaleout or scalein.
	Verb string
	// Name is the job's name (argument or Arena's --name).
	Name string
	// Replicas is scale's --replicas.
	Replicas int
	// Count is scaleout's / scalein's --count.
	Count int
	// Instances are scalein's --instance pods, removed first.
	Instances []string
	// Timeout is --timeout: how long to wait for the membership to reach the
	// new size before restoring the previous replicas; 0 does not wait.
	Timeout time.Duration
	// Poll is how often the job is read while waiting.
	Poll time.Duration

	timeout string
	factory *factory
	clients *Clients
}

func newScaleCommand(f *factory) *cobra.Command {
	o := &ScaleOptions{Verb: verbScale, factory: f}
	cmd := &cobra.Command{
		Use:   "scale NAME --replicas N",
		Short: "Set a job's desired workers (spec.replicas, through /scale, as kubectl scale and an HPA do)",
		Example: f.examples(`  etjob scale elastic-training --replicas 4
  etjob scale elastic-training --replicas 4 --timeout 10m   # wait until 4 workers are members`),
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: f.completeJobNames,
		RunE:              o.runE,
	}
	cmd.Flags().IntVar(&o.Replicas, "replicas", -1, "the desired number of workers")
	cmd.Flags().StringVar(&o.timeout, "timeout", "0", "wait this long (e.g. 60s, 10m) for the membership to reach --replicas, else restore the previous replicas; 0: do not wait")
	cmd.Flags().StringVar(&o.Name, "name", "", "the job's name (or give it as the argument)")
	return cmd
}

func newScaleOutInCommand(f *factory, verb string) *cobra.Command {
	build := func(use string, arena bool) *cobra.Command {
		o := &ScaleOptions{Verb: verb, factory: f}
		what, dir := "Add", "out"
		if verb == verbScaleIn {
			what, dir = "Remove", "in"
		}
		cmd := &cobra.Command{
			Use:               use,
			Short:             what + " workers and wait until the membership has changed (Arena: arena scale" + dir + " etjob)",
			ValidArgsFunction: f.completeJobNames,
			RunE:              o.runE,
		}
		if arena {
			cmd.Args = cobra.NoArgs
			cmd.Short = what + " workers; Arena's spelling of `" + f.prog + " " + verb + " NAME`"
		} else {
			cmd.Args = cobra.MaximumNArgs(1)
		}
		cmd.Flags().StringVar(&o.Name, "name", "", "the job's name")
		cmd.Flags().IntVar(&o.Count, "count", 1, "the number of workers to "+strings.ToLower(what))
		cmd.Flags().StringVar(&o.timeout, "timeout", "60s", "wait this long (e.g. 60s, 10m, or seconds) for the new membership, else restore the previous replicas")
		if verb == verbScaleIn {
			cmd.Flags().StringArrayVar(&o.Instances, "instance", nil, "a worker pod to remove (repeat); --count defaults to their number")
			_ = cmd.RegisterFlagCompletionFunc("instance", f.completeWorkerPods(&o.Name))
		}
		_ = cmd.RegisterFlagCompletionFunc("name", f.completeJobNamesMulti)
		return cmd
	}
	cmd := build(verb+" NAME", false)
	if verb == verbScaleOut {
		cmd.Example = f.examples(`  etjob scaleout elastic-training --count 1 --timeout 10m
  # Arena's spelling (seed 001)
  etjob scaleout etjob --name="elastic-training" --count=1 --timeout=10m`)
	} else {
		cmd.Example = f.examples(`  etjob scalein elastic-training --count 1 --timeout 10m
  etjob scalein elastic-training --instance elastic-training-worker-2
  # Arena's spelling (seed 001)
  etjob scalein etjob --name="elastic-training" --count=1 --timeout=10m`)
	}
	et := build("etjob --name NAME", true)
	et.Aliases = []string{"et"}
	cmd.AddCommand(et)
	return cmd
}

func (o *ScaleOptions) runE(cmd *cobra.Command, args []string) error {
	if err := o.Complete(cmd, args); err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return err
	}
	return o.Run(cmd.Context())
}

// Complete fills the options from the command line.
func (o *ScaleOptions) Complete(cmd *cobra.Command, args []string) error {
	if len(args) == 1 {
		if o.Name != "" && o.Name != args[0] {
			return fmt.Errorf("the job is named twice: %q and --name %q", args[0], o.Name)
		}
		o.Name = args[0]
	}
	if o.Verb == verbScaleIn && len(o.Instances) > 0 && !cmd.Flags().Changed("count") {
		o.Count = len(o.Instances)
	}
	d, err := parseTimeout(o.timeout)
	if err != nil {
		return err
	}
	o.Timeout = d
	if o.Poll == 0 {
		o.Poll = time.Second
	}
	cs, err := o.factory.Clients()
	o.clients = cs
	return err
}

// maxTimeout is the longest --timeout: what a ScaleRequest's int32
// timeoutSeconds holds (about 68 years). Past it the seconds wrapped to a
// negative or a short timeout (FuzzScaleFlags).
const maxTimeout = math.MaxInt32 * time.Second

// parseTimeout reads --timeout: a duration (10m) or whole seconds (600).
func parseTimeout(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if n, aerr := strconv.ParseInt(s, 10, 64); aerr == nil {
		d, err = time.Duration(n)*time.Second, nil
		if n > int64(maxTimeout/time.Second) {
			d = maxTimeout + 1
		}
	}
	if err != nil || d < 0 {
		return 0, fmt.Errorf("--timeout %q: give a duration such as 60s or 10m", s)
	}
	if d > maxTimeout {
		return 0, fmt.Errorf("--timeout %q: at most %d seconds", s, int64(maxTimeout/time.Second))
	}
	return d, nil
}

// requestTimeoutSeconds is a ScaleOut / ScaleIn request's timeoutSeconds for
// --timeout d: d in whole seconds, rounded up; 60, the CRD's default, for 0.
func requestTimeoutSeconds(d time.Duration) int32 {
	secs := (d + time.Second - 1) / time.Second
	if secs < 1 {
		return 60
	}
	return int32(secs)
}

// Validate checks the flags.
func (o *ScaleOptions) Validate() error {
	if o.Name == "" {
		return fmt.Errorf("the job's name is missing: %s NAME, or --name NAME", o.Verb)
	}
	// The CRD's bound is also what keeps int32(n) from wrapping: --replicas
	// 4294967297 scaled the job to 1 (FuzzScaleFlags).
	const limit = etjobv1.MaxWorkers
	switch o.Verb {
	case verbScale:
		if o.Replicas < 0 {
			return fmt.Errorf("--replicas must be set, to 1 or more")
		}
		if o.Replicas > limit {
			return fmt.Errorf("--replicas %d: at most %d", o.Replicas, limit)
		}
	case verbScaleIn:
		if len(o.Instances) > 0 && o.Count != len(o.Instances) {
			return fmt.Errorf("--count %d and %d --instance pods disagree: give one", o.Count, len(o.Instances))
		}
		fallthrough
	default:
		if o.Count < 1 || o.Count > limit {
			return fmt.Errorf("--count %d: must be between 1 and %d", o.Count, limit)
		}
	}
	return nil
}

// Run scales the job, then waits for the membership.
func (o *ScaleOptions) Run(ctx context.Context) error {
	c := o.clients.Client
	f := o.factory
	var job etjobv1.ElasticJob
	key := client.ObjectKey{Namespace: o.clients.Namespace, Name: o.Name}
	if err := c.Get(ctx, key, &job); err != nil {
		return fmt.Errorf("getting %s in namespace %s: %w", jobRef(o.Name), key.Namespace, err)
	}
	prev := job.Spec.Replicas
	target, flag := o.target(prev)
	if err := ScaleRefusal(&job, target, flag); err != nil {
		return err
	}
	hpas, err := targetingHPAs(ctx, c, &job)
	if err != nil {
		return err
	}
	if len(hpas) > 0 {
		return fmt.Errorf("refused: HorizontalPodAutoscaler %s targets %s and would undo this; change the HPA's minReplicas/maxReplicas, or delete it first",
			strings.Join(hpas, ", "), jobRef(job.Name))
	}
	if o.Verb != verbScale {
		return o.request(ctx, &job, prev, target)
	}
	if target == prev {
		fmt.Fprintf(f.out(), "%s already has %d desired workers\n", jobRef(job.Name), prev)
		return nil
	}
	if err := setReplicas(ctx, c, &job, target); err != nil {
		return err
	}
	fmt.Fprintf(f.out(), "%s scaled (%d -> %d workers)\n", jobRef(job.Name), prev, target)
	if o.Verb != verbScale {
		f.log().Info(fmt.Sprintf("The %s of %s from %d to %d workers has been submitted successfully", o.Verb, job.Name, prev, target))
	}
	if o.Timeout <= 0 {
		return nil
	}
	return o.wait(ctx, &job, prev, target)
}

func (o *ScaleOptions) target(cur int32) (int32, string) {
	switch o.Verb {
	case verbScaleOut:
		return cur + int32(o.Count), "--count"
	case verbScaleIn:
		if len(o.Instances) > 0 {
			return cur - int32(o.Count), "--instance"
		}
		return cur - int32(o.Count), "--count"
	}
	return int32(o.Replicas), "--replicas"
}

// ScaleRefusal refuses to scale a finished job, naming its state, and a
// desired size across the job's min or max, naming the flag and the limit.
// The API server would refuse the latter too (CEL), less clearly.
func ScaleRefusal(job *etjobv1.ElasticJob, target int32, flag string) error {
	if why := core.FinishedRefusal(job); why != "" {
		return fmt.Errorf("refused: %s", why)
	}
	switch {
	case target < job.Spec.MinReplicas:
		return fmt.Errorf("refused: %s would take %s to %d workers, below its minimum of %d (spec.minReplicas, --min-workers at submit)",
			flag, jobRef(job.Name), target, job.Spec.MinReplicas)
	case target > job.Spec.MaxReplicas:
		return fmt.Errorf("refused: %s would take %s to %d workers, above its maximum of %d (spec.maxReplicas, --max-workers at submit)",
			flag, jobRef(job.Name), target, job.Spec.MaxReplicas)
	}
	return nil
}

// targetingHPAs names the HorizontalPodAutoscalers of the job's namespace
// whose scaleTargetRef is this ElasticJob.
func targetingHPAs(ctx context.Context, c client.Client, job *etjobv1.ElasticJob) ([]string, error) {
	var list autoscalingv2.HorizontalPodAutoscalerList
	if err := c.List(ctx, &list, client.InNamespace(job.Namespace)); err != nil {
		if apierrors.IsForbidden(err) || apierrors.IsNotFound(err) {
			return nil, nil // cannot see HPAs: the API server's own rules still apply
		}
		return nil, fmt.Errorf("listing HorizontalPodAutoscalers: %w", err)
	}
	return core.HPAsTargeting(list.Items, job.Name), nil
}

// checkInstances refuses --instance pods that are not workers of the job.
func (o *ScaleOptions) checkInstances(ctx context.Context, job *etjobv1.ElasticJob) error {
	for _, name := range o.Instances {
		var pod corev1.Pod
		if err := o.clients.Client.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: name}, &pod); err != nil {
			return fmt.Errorf("--instance %s: %w", name, err)
		}
		if pod.Labels[etjobv1.LabelJobName] != job.Name || pod.Labels[etjobv1.LabelRole] != etjobv1.RoleWorker {
			return fmt.Errorf("--instance %s: not a worker of %s", name, jobRef(job.Name))
		}
	}
	return nil
}

// request creates a ScaleOut or ScaleIn object (et-operator's request
// objects): the controller changes spec.replicas, marks named instances,
// and on timeout rolls a scale-out back, also after this command exits. The
// command waits for the request's outcome and prints progress meanwhile.
func (o *ScaleOptions) request(ctx context.Context, job *etjobv1.ElasticJob, prev, target int32) error {
	if err := o.checkInstances(ctx, job); err != nil {
		return err
	}
	f := o.factory
	c := o.clients.Client
	spec := etjobv1.ScaleRequestSpec{Job: job.Name, Count: int32(o.Count), Instances: o.Instances,
		TimeoutSeconds: requestTimeoutSeconds(o.Timeout)}
	meta := metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", job.Name, time.Now().Unix()), Namespace: job.Namespace}
	var req interface {
		client.Object
		Request() (*etjobv1.ScaleRequestSpec, *etjobv1.ScaleRequestStatus)
	}
	kind := "scaleout"
	if o.Verb == verbScaleOut {
		req = &etjobv1.ScaleOut{ObjectMeta: meta, Spec: spec}
	} else {
		req, kind = &etjobv1.ScaleIn{ObjectMeta: meta, Spec: spec}, "scalein"
	}
	if err := c.Create(ctx, req); err != nil {
		return fmt.Errorf("creating the %s request: %w", kind, err)
	}
	fmt.Fprintf(f.out(), "%s.etjob.dev/%s created\n", kind, req.GetName())
	f.log().Info(fmt.Sprintf("The %s job %s has been submitted successfully (%s: %d -> %d workers)", kind, req.GetName(), job.Name, prev, target))
	// The controller decides the outcome; wait a little longer than its timeout.
	deadline := time.Now().Add(time.Duration(spec.TimeoutSeconds)*time.Second + 15*time.Second)
	lastMembers := int32(-1)
	for {
		if err := o.getRetrying(ctx, client.ObjectKeyFromObject(req), req, deadline); err != nil {
			return fmt.Errorf("reading the %s request %s: %w", kind, req.GetName(), err)
		}
		_, st := req.Request()
		var cur etjobv1.ElasticJob
		if err := c.Get(ctx, client.ObjectKeyFromObject(job), &cur); err == nil && cur.Status.Members != lastMembers {
			f.log().Info(fmt.Sprintf("%s: %d of %d workers are members, %d leaving", job.Name, cur.Status.Members, target, cur.Status.LeavingReplicas))
			lastMembers = cur.Status.Members
		}
		switch st.Phase {
		case etjobv1.ScaleRequestSucceeded:
			f.log().Info(fmt.Sprintf("%s %s succeeded: %s", kind, req.GetName(), st.Message))
			return nil
		case etjobv1.ScaleRequestRefused, etjobv1.ScaleRequestRolledBack, etjobv1.ScaleRequestTimedOut:
			return fmt.Errorf("%s %s %s: %s", kind, req.GetName(), strings.ToLower(string(st.Phase)), st.Message)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s %s is still %q after %ds: is the etjob controller running? (kubectl get %s %s -o yaml)",
				kind, req.GetName(), st.Phase, spec.TimeoutSeconds, kind, req.GetName())
		}
		if err := sleep(ctx, o.Poll); err != nil {
			return err
		}
	}
}

// setReplicas writes spec.replicas through the /scale subresource.
func setReplicas(ctx context.Context, c client.Client, job *etjobv1.ElasticJob, n int32) error {
	for attempt := 0; ; attempt++ {
		scale := &autoscalingv1.Scale{}
		if err := c.SubResource("scale").Get(ctx, job, scale); err != nil {
			return fmt.Errorf("reading the scale of %s: %w", jobRef(job.Name), err)
		}
		scale.Spec.Replicas = n
		err := c.SubResource("scale").Update(ctx, job, client.WithSubResourceBody(scale))
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt >= 4 {
			return fmt.Errorf("scaling %s to %d: %w", jobRef(job.Name), n, err)
		}
	}
}

// wait waits until the membership reaches target, printing progress; on
// timeout it restores prev (unless someone else changed replicas meanwhile).
func (o *ScaleOptions) wait(ctx context.Context, job *etjobv1.ElasticJob, prev, target int32) error {
	f := o.factory
	c := o.clients.Client
	key := client.ObjectKeyFromObject(job)
	deadline := time.Now().Add(o.Timeout)
	lastMembers, lastLeaving := int32(-1), int32(-1)
	var cur etjobv1.ElasticJob
	for {
		if err := o.getRetrying(ctx, key, &cur, deadline); err != nil {
			return fmt.Errorf("waiting for %s: %w", jobRef(job.Name), err)
		}
		st := cur.Status
		if st.Members != lastMembers || st.LeavingReplicas != lastLeaving {
			f.log().Info(fmt.Sprintf("%s: %d of %d workers are members, %d leaving", job.Name, st.Members, target, st.LeavingReplicas))
			lastMembers, lastLeaving = st.Members, st.LeavingReplicas
		}
		done := st.Members >= target
		if target < prev {
			done = st.Members <= target && st.LeavingReplicas == 0
		}
		if done && st.ObservedGeneration >= cur.Generation {
			f.log().Info(fmt.Sprintf("%s has %d members", job.Name, st.Members))
			return nil
		}
		if s := jobStatus(&cur); s == "SUCCEEDED" || s == "FAILED" {
			return fmt.Errorf("%s finished (%s) while waiting for %d members", jobRef(job.Name), s, target)
		}
		if !time.Now().Before(deadline) {
			break
		}
		if err := sleep(ctx, o.Poll); err != nil {
			return err
		}
	}
	msg := fmt.Sprintf("%s timed out after %s: %d of %d workers are members", o.Verb, o.Timeout, cur.Status.Members, target)
	if cur.Spec.Replicas != target {
		return fmt.Errorf("%s; replicas were changed to %d by someone else meanwhile, left as they are", msg, cur.Spec.Replicas)
	}
	if err := setReplicas(ctx, c, &cur, prev); err != nil {
		return fmt.Errorf("%s; restoring the previous %d replicas failed: %w", msg, prev, err)
	}
	f.log().Warn(fmt.Sprintf("%s; restored the previous %d replicas", msg, prev))
	return fmt.Errorf("%s; replicas restored to %d", msg, prev)
}

// getRetrying reads key into obj for a wait of minutes, riding over a
// moment's API server trouble (a restart, a lost leader, 429s): a transient
// failure is tried again every poll until deadline, with one warning per
// run of failures; any other error is returned at once.
func (o *ScaleOptions) getRetrying(ctx context.Context, key client.ObjectKey, obj client.Object, deadline time.Time) error {
	warned := false
	for {
		err := o.clients.Client.Get(ctx, key, obj)
		if err == nil || !transient(err) || !time.Now().Before(deadline) {
			return err
		}
		if !warned {
			o.factory.log().Warn(fmt.Sprintf("reading from the API server failed, trying again: %v", err))
			warned = true
		}
		if err := sleep(ctx, o.Poll); err != nil {
			return err
		}
	}
}

// transient reports whether a failed read may succeed if tried again.
func transient(err error) bool {
	if apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsUnexpectedServerError(err) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
