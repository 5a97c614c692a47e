package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/demo"
	"github.com/etjob/etjob/internal/driver"
	"github.com/etjob/etjob/internal/localcluster"
)

// Sizes of the chaos run: the job is the demo's (4 workers, min 2, max 6).
const (
	desiredWorkers = 4
	minWorkers     = 2
	// CheckpointEvery is the example's periodic checkpoint interval in
	// steps (examples/digits/train.py --checkpoint-every): a hard loss may
	// redo at most this many steps.
	CheckpointEvery = 10
	// MinMembershipChanges is how many membership generations a run must
	// go through.
	MinMembershipChanges = 25
	// APIServerDown is how long the kube-apiserver stays down in the middle
	// of a scale-out.
	APIServerDown = 30 * time.Second
)

// Options configure a chaos run.
type Options struct {
	// Cluster is up (6 spot + 2 on-demand nodes) and records decisions.
	Cluster  *localcluster.Cluster
	RepoRoot string
	// Seed draws the schedule and the victims.
	Seed int64
	// Epochs and Width size the training.
	Epochs, Width int
	// Notice is the reclamation notice of noticed faults.
	Notice time.Duration
	// Baseline runs the undisturbed comparison run alongside.
	Baseline bool
	// RecordPath is the JSON-lines run record; DecisionsPath the
	// controller's decision record.
	RecordPath, DecisionsPath string
	Out                       io.Writer
}

// Fault is one line of the run record: a fault and what triggered it.
type Fault struct {
	Seq       int      `json:"seq"`
	Kind      string   `json:"kind"`
	Nodes     []string `json:"nodes,omitempty"`
	Providers []string `json:"providers,omitempty"`
	Notice    string   `json:"notice,omitempty"`
	// Trigger says what fired it: "step>=N" (training progress),
	// "generation>G" (a membership change), "capacity<desired (N spot
	// nodes)" (an add-node after a loss), "before burst-below-min".
	Trigger           string `json:"trigger"`
	TriggerStep       int    `json:"triggerStep"`
	TriggerGeneration int64  `json:"triggerGeneration"`
	// BeforeResume: a loss during a reconfiguration fired before training
	// resumed.
	BeforeResume *bool     `json:"beforeResume,omitempty"`
	Start        time.Time `json:"start"`
	End          time.Time `json:"end"`
	Note         string    `json:"note,omitempty"`
	Error        string    `json:"error,omitempty"`
}

// Check is one verdict of the run.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// Result is what a chaos run did and found.
type Result struct {
	Seed     int64         `json:"seed"`
	Schedule []Step        `json:"schedule"`
	Faults   []Fault       `json:"-"`
	Wall     time.Duration `json:"wall"`
	Checks   []Check       `json:"checks"`
	// GenerationStart and GenerationEnd are the membership generation when
	// the first fault fired and when the job completed.
	GenerationStart, GenerationEnd int64               `json:"-"`
	Resumes                        []driver.Resume     `json:"-"`
	Replay                         *ReplayReport       `json:"-"`
	Accuracy, BaselineAccuracy     float64             `json:"-"`
	Steps                          int                 `json:"-"`
	Job                            *etjobv1.ElasticJob `json:"-"`
}

// OK says whether every check passed.
func (r *Result) OK() bool {
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return len(r.Checks) > 0
}

type runner struct {
	Options
	d       *driver.Driver
	rng     *rand.Rand
	res     *Result
	start   time.Time
	rec     *os.File
	mu      sync.Mutex
	doomed  map[string]bool
	provIdx int
	// suspended: the burst below min saw Suspended/WaitingForCapacity.
	suspended bool
	// cancelled: the withdrawn notice's node and whether it survived.
	cancelled     string
	cancelledOK   bool
	cancelledNote string
}

const job, namespace = "chaos", "default"

// Run runs the seeded schedule on the cluster, waits for the job to finish,
// deletes it, replays the decision record and checks the run. It returns
// the result even when it fails part-way; the error says what stopped it.
func Run(ctx context.Context, o Options) (*Result, error) {
	d, err := driver.New(o.Cluster, namespace, job, 200*time.Millisecond)
	if err != nil {
		return nil, err
	}
	rec, err := os.OpenFile(o.RecordPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--record: %w", err)
	}
	defer rec.Close()
	r := &runner{Options: o, d: d, rec: rec, doomed: map[string]bool{},
		rng: rand.New(rand.NewPCG(uint64(o.Seed), 0x76696374696d)), //nolint:gosec // reproducible victims
		res: &Result{Seed: o.Seed, Schedule: Schedule(o.Seed)}}
	err = r.run(ctx)
	r.res.Wall = time.Since(r.start)
	r.check(err)
	r.write(map[string]any{"end": time.Now(), "wall": r.res.Wall.String(), "checks": r.res.Checks, "ok": r.res.OK(),
		"error": errString(err), "generationStart": r.res.GenerationStart, "generationEnd": r.res.GenerationEnd})
	return r.res, err
}

func (r *runner) say(format string, args ...any) {
	fmt.Fprintf(r.Out, "[%6.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

func (r *runner) write(v any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, _ := json.Marshal(v)
	_, _ = r.rec.Write(append(b, '\n'))
}

func (r *runner) record(f Fault) {
	f.Seq = len(r.res.Faults) + 1
	r.res.Faults = append(r.res.Faults, f)
	r.write(f)
	msg := fmt.Sprintf("fault %d %s %v (trigger %s, step %d, gen %d)", f.Seq, f.Kind, f.Nodes, f.Trigger, f.TriggerStep, f.TriggerGeneration)
	if len(f.Providers) > 0 {
		msg += fmt.Sprintf(" providers %v", f.Providers)
	}
	if f.Note != "" {
		msg += ": " + f.Note
	}
	if f.Error != "" {
		msg += " ERROR " + f.Error
	}
	r.say("%s", msg)
}

var errTrainingDone = errors.New("training finished before the schedule did: raise --epochs")

func (r *runner) run(ctx context.Context) error {
	r.start = time.Now()
	r.write(map[string]any{"seed": r.Seed, "schedule": r.res.Schedule, "start": r.start, "epochs": r.Epochs, "width": r.Width,
		"notice": r.Notice.String(), "decisions": r.DecisionsPath})
	r.say("seed %d, schedule (%d faults, %d members' nodes taken): %s", r.Seed, len(r.res.Schedule), MembershipLosses(r.res.Schedule), String(r.res.Schedule))
	undisturbed := func() (float64, error) { return 0, nil }
	if r.Baseline {
		undisturbed = demo.Beside(ctx, func(ctx context.Context) (float64, error) {
			return demo.Undisturbed(ctx, r.RepoRoot, r.Epochs, r.Width, desiredWorkers)
		})
	}
	digits := driver.Digits{Repo: r.RepoRoot, Shared: filepath.Join(r.Cluster.Dir, "shared", job), Epochs: r.Epochs, Width: r.Width, Replicas: desiredWorkers}
	if err := r.d.SubmitDigits(ctx, digits); err != nil {
		return err
	}
	r.say("submitted ElasticJob %s/%s: %d workers, min %d, max %d, %d epochs", namespace, job, desiredWorkers, minWorkers, desiredWorkers+2, r.Epochs)
	if err := r.settle(ctx, time.Time{}, 6*time.Minute); err != nil {
		return err
	}
	j, err := r.d.Get(ctx)
	if err != nil {
		return err
	}
	r.res.GenerationStart = j.Status.Membership.Generation
	for i, st := range r.res.Schedule {
		if err := r.fault(ctx, i, st); err != nil {
			return fmt.Errorf("fault %d (%s): %w", i+1, st.Kind, err)
		}
	}
	r.say("schedule done; waiting for the job to complete")
	if err := r.d.WaitFor(ctx, "the job to complete", 15*time.Minute, func() (bool, error) {
		j, err := r.d.Get(ctx)
		if err != nil {
			return false, nil
		}
		if err := driver.Failed(j); err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(j.Status.Conditions, etjobv1.ConditionComplete), nil
	}); err != nil {
		return err
	}
	if j, err = r.d.Get(ctx); err == nil {
		r.res.Job = j
		r.res.GenerationEnd = j.Status.Membership.Generation
	}
	r.say("the job completed; waiting for the undisturbed run")
	acc, err := undisturbed()
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.res.BaselineAccuracy = acc
	r.mu.Unlock()
	return r.deleteJob(ctx)
}

// fault runs one scheduled step: it waits for its trigger (training
// progress), injects it, keeps capacity at the desired size and waits until
// training runs with every desired worker again.
func (r *runner) fault(ctx context.Context, i int, st Step) error {
	step, gen, err := r.trigger(ctx, st.Gap)
	if err != nil {
		return err
	}
	f := Fault{Kind: st.Kind, Trigger: fmt.Sprintf("step>=%d", step), TriggerStep: step, TriggerGeneration: gen, Start: time.Now()}
	var ferr error
	switch st.Kind {
	case KindNotice, KindHard:
		notice := r.Notice
		if st.Kind == KindHard {
			notice = 0
		}
		ferr = r.reclaim(ctx, &f, 1, notice)
	case KindBurst:
		ferr = r.reclaim(ctx, &f, st.K, r.Notice)
	case KindBurstBelowMin:
		ferr = r.burstBelowMin(ctx, &f)
	case KindReconfLoss:
		ferr = r.reconfLoss(ctx, &f)
	case KindCancel:
		ferr = r.cancel(ctx, &f)
	case KindRestartController:
		ferr = r.restart(ctx, &f, "etjob-controller")
	case KindRestartAPIServer:
		ferr = r.restart(ctx, &f, "kube-apiserver")
	case KindAPIServerDownScaleOut:
		ferr = r.apiServerDownScaleOut(ctx, &f)
	case KindLauncherLost:
		ferr = r.launcherLost(ctx, &f)
	case KindRestartAgent:
		victims, err := r.victims(ctx, 1, false)
		if err != nil {
			return err
		}
		f.Nodes = victims
		ferr = r.restart(ctx, &f, "agent-"+victims[0])
	default:
		return fmt.Errorf("unknown fault kind %q", st.Kind)
	}
	f.End = time.Now()
	if ferr != nil {
		f.Error = ferr.Error()
	}
	if f.Kind != "" {
		r.record(f)
	}
	if ferr != nil {
		return ferr
	}
	if err := r.topUp(ctx); err != nil {
		return err
	}
	return r.settle(ctx, f.End, 4*time.Minute)
}

// trigger waits until training progressed gap steps and returns the step and
// membership generation it fired at.
func (r *runner) trigger(ctx context.Context, gap int) (int, int64, error) {
	target := r.d.MaxStep() + gap
	err := r.d.WaitFor(ctx, fmt.Sprintf("training step %d", target), 5*time.Minute, func() (bool, error) {
		lines, _ := r.d.Logs()
		if _, _, done := driver.Final(lines); done {
			return false, errTrainingDone
		}
		return driver.MaxStep(lines) >= target, nil
	})
	if err != nil {
		return 0, 0, err
	}
	j, err := r.d.Get(ctx)
	if err != nil {
		return 0, 0, err
	}
	return r.d.MaxStep(), j.Status.Membership.Generation, nil
}

// reclaim takes k members' nodes at once with the notice (0: hard).
func (r *runner) reclaim(ctx context.Context, f *Fault, k int, notice time.Duration) error {
	victims, err := r.victims(ctx, k, notice > 0)
	if err != nil {
		return err
	}
	f.Nodes, f.Providers, f.Notice = victims, r.providers(ctx, victims), notice.String()
	return r.reclaimAll(ctx, victims, notice)
}

func (r *runner) reclaimAll(ctx context.Context, nodes []string, notice time.Duration) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		r.doom(n)
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = r.Cluster.Reclaim(ctx, n, notice) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// burstBelowMin removes the idle spot nodes (a capacity drought), reclaims
// all members' nodes but one at once, waits for Suspended /
// WaitingForCapacity, then topUp adds nodes until the job resumes.
func (r *runner) burstBelowMin(ctx context.Context, f *Fault) error {
	idle, err := r.idleSpot(ctx)
	if err != nil {
		return err
	}
	for _, n := range idle {
		d := Fault{Kind: KindDrought, Nodes: []string{n}, Providers: r.providers(ctx, []string{n}), Trigger: "before " + KindBurstBelowMin,
			TriggerStep: f.TriggerStep, TriggerGeneration: f.TriggerGeneration, Notice: "0s", Start: time.Now()}
		err := r.reclaimAll(ctx, []string{n}, 0)
		d.End = time.Now()
		if err != nil {
			d.Error = err.Error()
		}
		r.record(d)
		if err != nil {
			return err
		}
	}
	j, err := r.d.Get(ctx)
	if err != nil {
		return err
	}
	k := int(j.Status.Members) - minWorkers + 1
	victims, err := r.victims(ctx, k, true)
	if err != nil {
		return err
	}
	f.Nodes, f.Providers, f.Notice, f.Start = victims, r.providers(ctx, victims), r.Notice.String(), time.Now()
	done := make(chan error, 1)
	go func() { done <- r.reclaimAll(ctx, victims, r.Notice) }()
	werr := r.d.WaitFor(ctx, "Suspended/WaitingForCapacity", 2*time.Minute, func() (bool, error) {
		j, err := r.d.Get(ctx)
		if err != nil {
			return false, nil
		}
		c := meta.FindStatusCondition(j.Status.Conditions, etjobv1.ConditionSuspended)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == etjobv1.ReasonWaitingForCapacity, nil
	})
	r.suspended = werr == nil
	if werr == nil {
		f.Note = "the job suspended (WaitingForCapacity)"
	}
	return errors.Join(<-done, werr)
}

// reconfLoss reclaims one member's node and, as soon as the membership
// generation changed, a second one, before training resumed.
func (r *runner) reconfLoss(ctx context.Context, f *Fault) error {
	victims, err := r.victims(ctx, 2, true)
	if err != nil {
		return err
	}
	j, err := r.d.Get(ctx)
	if err != nil {
		return err
	}
	g0 := j.Status.Membership.Generation
	lines, _ := r.d.Logs()
	resumes := len(driver.Resumes(lines))
	f.Nodes, f.Providers, f.Notice = victims[:1], r.providers(ctx, victims[:1]), r.Notice.String()
	first := make(chan error, 1)
	go func() { first <- r.reclaimAll(ctx, victims[:1], r.Notice) }()
	var gen int64
	werr := r.d.WaitFor(ctx, fmt.Sprintf("membership generation > %d", g0), time.Minute, func() (bool, error) {
		j, err := r.d.Get(ctx)
		if err != nil {
			return false, nil
		}
		gen = j.Status.Membership.Generation
		return gen > g0, nil
	})
	if werr != nil {
		return errors.Join(<-first, werr)
	}
	lines, _ = r.d.Logs()
	before := len(driver.Resumes(lines)) == resumes
	second := Fault{Kind: KindReconfLoss, Nodes: victims[1:], Providers: r.providers(ctx, victims[1:]), Notice: r.Notice.String(),
		Trigger: fmt.Sprintf("generation>%d", g0), TriggerStep: driver.MaxStep(lines), TriggerGeneration: gen, BeforeResume: &before, Start: time.Now()}
	serr := r.reclaimAll(ctx, victims[1:], r.Notice)
	ferr := <-first
	second.End = time.Now()
	if serr != nil {
		second.Error = serr.Error()
	}
	f.Note = "first of two; the second fired on the generation change"
	f.End = time.Now()
	r.record(*f)
	r.record(second)
	f.Kind = "" // both recorded: fault must not record f again
	return errors.Join(ferr, serr)
}

// cancel announces a reclamation with a deadline three notices away,
// withdraws it once the agent marked the node, and checks that the node
// survives its deadline with its notice cleared.
func (r *runner) cancel(ctx context.Context, f *Fault) error {
	victims, err := r.victims(ctx, 1, true)
	if err != nil {
		return err
	}
	node := victims[0]
	deadline := time.Now().Add(3 * r.Notice)
	f.Nodes, f.Notice = victims, (3 * r.Notice).String()
	p, err := r.Cluster.Announce(ctx, node, deadline)
	if err != nil {
		return err
	}
	f.Providers = []string{p}
	if err := r.waitNode(ctx, node, true); err != nil {
		return err
	}
	if err := r.Cluster.WithdrawNotice(ctx, node); err != nil {
		return err
	}
	withdrawn := time.Now()
	if err := r.waitNode(ctx, node, false); err != nil {
		return err
	}
	r.cancelled = node
	f.Note = fmt.Sprintf("withdrawn %.1fs before the deadline; the agent cleared the node's notice", deadline.Sub(withdrawn).Seconds())
	// Past the deadline the node must still be there and Ready.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(deadline) + 2*time.Second):
	}
	n, err := r.d.Clientset.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	r.cancelledOK = err == nil && core.NodeReady(n) && n.Annotations[etjobv1.AnnotationNodeNotice] == ""
	r.cancelledNote = fmt.Sprintf("node %s after its withdrawn deadline: present=%t", node, err == nil)
	if err == nil {
		r.cancelledNote += fmt.Sprintf(" ready=%t notice=%q", core.NodeReady(n), n.Annotations[etjobv1.AnnotationNodeNotice])
	}
	return nil
}

// waitNode waits until the node's agent marked (or cleared) the notice.
func (r *runner) waitNode(ctx context.Context, node string, marked bool) error {
	return r.d.WaitFor(ctx, fmt.Sprintf("node %s notice marked=%t", node, marked), time.Minute, func() (bool, error) {
		n, err := r.d.Clientset.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		_, ann := n.Annotations[etjobv1.AnnotationNodeNotice]
		tainted := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == etjobv1.TaintReclaiming })
		if marked {
			return ann, nil
		}
		return !ann && !tainted, nil
	})
}

// apiServerDownScaleOut scales the job out by one worker (a spot node added
// for it first), stops the kube-apiserver for APIServerDown once the
// controller created the new worker's pod, starts it again, waits until the
// job trains at the larger size and scales it back in.
func (r *runner) apiServerDownScaleOut(ctx context.Context, f *Fault) error {
	name, err := r.Cluster.AddNode(ctx, "", true)
	if err != nil {
		return err
	}
	f.Nodes = []string{name}
	if err := r.scale(ctx, desiredWorkers+1); err != nil {
		return err
	}
	if err := r.d.WaitFor(ctx, "the scale-out's new worker pod", time.Minute, func() (bool, error) {
		n, err := r.livePods(ctx, etjobv1.RoleWorker)
		return err == nil && len(n) > desiredWorkers, nil
	}); err != nil {
		return err
	}
	down := time.Now()
	if err := r.Cluster.RestartComponentAfter(ctx, "kube-apiserver", APIServerDown); err != nil {
		return err
	}
	f.Note = fmt.Sprintf("scaled out to %d (node %s added); the kube-apiserver down %s from the new worker's creation, ready again after %s",
		desiredWorkers+1, name, APIServerDown, time.Since(down).Round(100*time.Millisecond))
	if err := r.settleAt(ctx, down, 5*time.Minute, desiredWorkers+1); err != nil {
		return fmt.Errorf("after the kube-apiserver came back: %w", err)
	}
	return r.scale(ctx, desiredWorkers)
}

// scale sets the job's spec.replicas.
func (r *runner) scale(ctx context.Context, n int32) error {
	return r.d.WaitFor(ctx, fmt.Sprintf("spec.replicas set to %d", n), time.Minute, func() (bool, error) {
		j, err := r.d.Get(ctx)
		if err != nil {
			return false, nil
		}
		old := j.DeepCopy()
		j.Spec.Replicas = n
		return r.d.Client.Patch(ctx, j, client.MergeFrom(old)) == nil, nil
	})
}

// launcherLost deletes the launcher's pod with no grace period, as the pod
// garbage collector does once a lost node's object is gone: its rendezvous
// store goes with it.
func (r *runner) launcherLost(ctx context.Context, f *Fault) error {
	pods, err := r.livePods(ctx, etjobv1.RoleLauncher)
	if err != nil {
		return err
	}
	if len(pods) != 1 {
		return fmt.Errorf("want one launcher pod, found %d", len(pods))
	}
	p := pods[0]
	zero := int64(0)
	if err := r.d.Clientset.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return err
	}
	f.Nodes = []string{p.Spec.NodeName}
	f.Note = fmt.Sprintf("deleted launcher %s with no grace period (its rendezvous store lost)", p.Name)
	return nil
}

// livePods lists the job's pods of a role that are neither finished nor
// being deleted.
func (r *runner) livePods(ctx context.Context, role string) ([]corev1.Pod, error) {
	pods, err := r.d.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: etjobv1.LabelJobName + "=" + job + "," + etjobv1.LabelRole + "=" + role})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool {
		return p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}), nil
}

func (r *runner) restart(ctx context.Context, f *Fault, component string) error {
	f.Note = "restarted " + component
	return r.Cluster.RestartComponent(ctx, component)
}

// topUp adds spot nodes while fewer than the desired workers' worth are
// left: capacity returns, so training can go on.
func (r *runner) topUp(ctx context.Context) error {
	for {
		live, err := r.liveSpot(ctx)
		if err != nil {
			return err
		}
		if len(live) >= desiredWorkers {
			return nil
		}
		j, err := r.d.Get(ctx)
		if err != nil {
			return err
		}
		f := Fault{Kind: KindAddNode, Trigger: fmt.Sprintf("capacity<desired (%d spot nodes)", len(live)), TriggerStep: r.d.MaxStep(),
			TriggerGeneration: j.Status.Membership.Generation, Start: time.Now()}
		name, err := r.Cluster.AddNode(ctx, "", true)
		f.End, f.Nodes, f.Providers = time.Now(), []string{name}, r.providers(ctx, []string{name})
		if err != nil {
			f.Error = err.Error()
		}
		r.record(f)
		if err != nil {
			return err
		}
	}
}

// settle waits until the job runs and a step after `after` trained with the
// desired number of workers.
func (r *runner) settle(ctx context.Context, after time.Time, timeout time.Duration) error {
	return r.settleAt(ctx, after, timeout, desiredWorkers)
}

// settleAt waits until the job runs and a step after `after` trained with
// n workers.
func (r *runner) settleAt(ctx context.Context, after time.Time, timeout time.Duration, n int32) error {
	t := float64(after.UnixNano()) / 1e9
	return r.d.WaitFor(ctx, fmt.Sprintf("training with %d workers", n), timeout, func() (bool, error) {
		j, err := r.d.Get(ctx)
		if err != nil {
			return false, nil
		}
		if err := driver.Failed(j); err != nil {
			return false, err
		}
		lines, _ := r.d.Logs()
		if _, _, done := driver.Final(lines); done {
			return false, errTrainingDone
		}
		if !meta.IsStatusConditionTrue(j.Status.Conditions, etjobv1.ConditionRunning) || j.Status.Members != n {
			return false, nil
		}
		for i := len(lines) - 1; i >= 0; i-- {
			if l := lines[i]; l.Kind == "step" && (after.IsZero() || l.T > t) {
				return l.World == int(n), nil
			}
		}
		return false, nil
	})
}

// victims picks n spot nodes that run members of the job. Noticed ones
// follow the provider cycle (aws, gcp, azure, alibaba), so that every cloud's
// notice drives reclaims; ties are drawn from the seed.
func (r *runner) victims(ctx context.Context, n int, noticed bool) ([]string, error) {
	j, err := r.d.Get(ctx)
	if err != nil {
		return nil, err
	}
	var cands []string
	for _, w := range j.Status.Workers {
		if w.State == etjobv1.WorkerMember && strings.HasPrefix(w.Node, "spot-") && !r.isDoomed(w.Node) {
			cands = append(cands, w.Node)
		}
	}
	sort.Strings(cands)
	if len(cands) < n {
		return nil, fmt.Errorf("wanted %d spot nodes with members, found %v", n, cands)
	}
	r.rng.Shuffle(len(cands), func(a, b int) { cands[a], cands[b] = cands[b], cands[a] })
	var out []string
	for len(out) < n {
		pick := 0
		if noticed {
			want := localcluster.Providers[r.provIdx%len(localcluster.Providers)]
			for i, c := range cands {
				if p := r.providers(ctx, []string{c}); len(p) == 1 && p[0] == want {
					pick = i
					break
				}
			}
			r.provIdx++
		}
		out = append(out, cands[pick])
		cands = slices.Delete(cands, pick, pick+1)
	}
	return out, nil
}

func (r *runner) providers(ctx context.Context, nodes []string) []string {
	var out []string
	for _, name := range nodes {
		p := "?"
		if n, err := r.d.Clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err == nil {
			p = n.Labels[etjobv1.LabelCloudProvider]
		}
		out = append(out, p)
	}
	return out
}

// liveSpot lists spot nodes that are not being reclaimed.
func (r *runner) liveSpot(ctx context.Context) ([]string, error) {
	var nodes *corev1.NodeList
	err := r.d.WaitFor(ctx, "the node list", time.Minute, func() (bool, error) {
		var err error
		nodes, err = r.d.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: etjobv1.LabelCapacityType + "=" + etjobv1.CapacityTypeSpot})
		return err == nil, nil
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range nodes.Items {
		if !r.isDoomed(n.Name) && n.DeletionTimestamp == nil {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// idleSpot lists live spot nodes with no pod of the job on them.
func (r *runner) idleSpot(ctx context.Context) ([]string, error) {
	live, err := r.liveSpot(ctx)
	if err != nil {
		return nil, err
	}
	pods, err := r.d.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: etjobv1.LabelJobName + "=" + job})
	if err != nil {
		return nil, err
	}
	busy := map[string]bool{}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			busy[p.Spec.NodeName] = true
		}
	}
	return slices.DeleteFunc(live, func(n string) bool { return busy[n] }), nil
}

// deleteJob deletes the job and waits until its pods are gone.
func (r *runner) deleteJob(ctx context.Context) error {
	j := &etjobv1.ElasticJob{ObjectMeta: metav1.ObjectMeta{Name: job, Namespace: namespace}}
	if err := r.d.Client.Delete(ctx, j); err != nil {
		return fmt.Errorf("deleting the job: %w", err)
	}
	r.say("deleted the job; waiting for its pods to go")
	_ = r.d.WaitFor(ctx, "the job's pods to go", 90*time.Second, func() (bool, error) {
		return r.orphans(ctx) == 0, nil
	})
	return nil
}

func (r *runner) orphans(ctx context.Context) int {
	pods, err := r.d.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: etjobv1.LabelJobName + "=" + job})
	if err != nil {
		return -1
	}
	return len(pods.Items)
}

// leftovers lists the processes of the job's pods that still run (pod
// directories are <namespace>_<pod>_<uid>, the job's pods named after it;
// the chart's controller and agents keep running).
func (r *runner) leftovers() []string {
	var out []string
	pids, _ := filepath.Glob(filepath.Join(r.Cluster.Dir, "nodes", "*", "pods", namespace+"_"+job+"-*", "*.pid"))
	for _, f := range pids {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &pid); err != nil || pid <= 0 {
			continue
		}
		if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if i := strings.LastIndexByte(string(stat), ')'); i > 0 && i+2 < len(stat) && stat[i+2] != 'Z' {
				out = append(out, fmt.Sprintf("%d (%s)", pid, f))
			}
		}
	}
	return out
}

func (r *runner) doom(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.doomed[node] = true
}

func (r *runner) isDoomed(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.doomed[node]
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
