// Package demo tells etjob's story on the local cluster with real torchrun
// training: a job on spot nodes loses one node with a notice (it shrinks in
// place), then two at once (it falls below min, checkpoints and waits), gets
// capacity back (it resumes and grows), and finishes; then it prints what that
// cost next to all-on-demand and what accuracy it reached next to an
// undisturbed run. `make demo` runs it; test/e2e runs a shorter one and
// asserts on the same Result.
package demo

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/driver"
	"github.com/etjob/etjob/internal/localcluster"
)

// Options configure the story.
type Options struct {
	Cluster  *localcluster.Cluster
	RepoRoot string
	// Namespace and Job name the ElasticJob.
	Namespace, Job string
	// Epochs and Width size the training (work per step and in all).
	Epochs, Width int
	// Notice is the reclamation notice of each reclaimed node.
	Notice time.Duration
	// StepsBeforeLoss is how far training gets before each reclamation.
	StepsBeforeLoss int
	// Baseline runs the undisturbed comparison run beside the job.
	Baseline bool
	// Reclaimed are clouds whose notices already drove a reclaim elsewhere
	// (another test of the same run): nodes of other clouds are reclaimed
	// first, so that every cloud's notice path is exercised.
	Reclaimed []string
	Out       io.Writer
}

// Result is what happened.
type Result struct {
	Wall             time.Duration
	Completed        bool
	Accuracy         float64
	BaselineAccuracy float64
	Steps            int
	LedgerOK         bool
	LedgerDetail     string
	Resumes          []driver.Resume
	Timeline         []string
	// Cost is worker node time × node price; OnDemandCost the same time at the
	// on-demand price.
	Cost, OnDemandCost float64
	Job                *etjobv1.ElasticJob
	// ReclaimedProviders are the clouds of the nodes the story reclaimed, in
	// order.
	ReclaimedProviders []string
}

type story struct {
	Options
	d     *driver.Driver
	start time.Time
	res   *Result
	mu    sync.Mutex
	// workerSeconds by node, and node prices.
	seconds map[string]float64
	prices  map[string]etjobv1.PricePerHour
}

// Run tells the story and returns what happened.
func Run(ctx context.Context, o Options) (*Result, error) {
	s, err := newStory(o)
	if err != nil {
		return nil, err
	}
	return s.res, s.run(ctx)
}

func (s *story) say(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.res.Timeline = append(s.res.Timeline, fmt.Sprintf("%6.1fs  %s", time.Since(s.start).Seconds(), line))
	s.mu.Unlock()
	fmt.Fprintf(s.Out, "[%6.1fs] %s\n", time.Since(s.start).Seconds(), line)
}

func (s *story) run(ctx context.Context) error {
	s.start = time.Now()
	// The undisturbed run trains beside the job (it shares the CPUs with
	// it: only its accuracy is compared, never its time), and is awaited
	// once the job completed.
	undisturbed := func() (float64, error) { return 0, nil }
	if s.Baseline {
		s.say("undisturbed baseline: the same training, 2 processes, no cluster, beside the job")
		// A story that ends early stops it too.
		bctx, cancel := context.WithCancel(ctx)
		defer cancel()
		undisturbed = Beside(bctx, s.baseline)
	}
	if err := s.submit(ctx); err != nil {
		return err
	}
	meter, stopMeter := context.WithCancel(ctx)
	defer stopMeter()
	go s.meter(meter)

	s.say("submitted ElasticJob %s/%s: 4 workers, min 2, max 6, on spot nodes", s.Namespace, s.Job)
	if err := s.waitMembers(ctx, 4, 6*time.Minute); err != nil {
		return err
	}
	if err := s.waitSteps(ctx, s.StepsBeforeLoss, 5*time.Minute); err != nil {
		return err
	}

	// 1. One spot node is reclaimed with a notice: the job shrinks in place.
	victims, err := s.workerNodes(ctx, 1)
	if err != nil {
		return err
	}
	s.say("reclaiming %s with a %s notice", victims[0], s.Notice)
	// Reclaim returns once the node is gone, at the notice's deadline; the
	// job shrinks within seconds of the notice, so the story goes on
	// meanwhile: a training that outruns the notice would otherwise end
	// before the next round.
	rctx, cancelReclaim := context.WithCancel(ctx)
	defer cancelReclaim()
	first := make(chan error, 1)
	go func() { first <- s.Cluster.Reclaim(rctx, victims[0], s.Notice) }()
	if err := s.waitResumes(ctx, 1, 3*time.Minute); err != nil {
		return err
	}
	s.say("training resumed with %d members", s.members(ctx))
	if err := s.waitSteps(ctx, s.d.MaxStep()+s.StepsBeforeLoss, 5*time.Minute); err != nil {
		return err
	}

	// 2. Two more at once: below min, everyone checkpoints and stops.
	victims, err = s.workerNodes(ctx, 2)
	if err != nil {
		return err
	}
	s.say("reclaiming %s and %s at once (%s notice): the job falls below min", victims[0], victims[1], s.Notice)
	var wg sync.WaitGroup
	errs := make([]error, len(victims))
	for i, v := range victims {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.Cluster.Reclaim(ctx, v, s.Notice) }()
	}
	wg.Wait()
	errs = append(errs, <-first) // its deadline passed while these waited for theirs
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	if err := s.waitCondition(ctx, etjobv1.ConditionSuspended, etjobv1.ReasonWaitingForCapacity, 3*time.Minute); err != nil {
		return err
	}
	s.say("the job is suspended: %s", s.conditionMessage(ctx, etjobv1.ConditionSuspended))

	// 3. Capacity returns: it resumes from the checkpoint and grows back.
	for range 3 {
		name, err := s.Cluster.AddNode(ctx, "", true)
		if err != nil {
			return err
		}
		s.say("added spot node %s", name)
	}
	if err := s.waitCondition(ctx, etjobv1.ConditionRunning, "", 5*time.Minute); err != nil {
		return err
	}
	s.say("the job runs again with %d members", s.members(ctx))

	// 4. It finishes.
	if err := s.waitCondition(ctx, etjobv1.ConditionComplete, "", 20*time.Minute); err != nil {
		return err
	}
	s.say("the job completed")
	stopMeter()
	acc, err := undisturbed()
	if err != nil {
		return err
	}
	if s.Baseline {
		s.res.BaselineAccuracy = acc
		s.say("baseline accuracy %.4f", acc)
	}
	return s.collect(ctx)
}

// submit creates the example's PV, PVC and ElasticJob (4 workers, min 2, max 6).
func (s *story) submit(ctx context.Context) error { return s.submitSized(ctx, 4) }

// submitSized submits the example with the given desired workers (min 2, max
// replicas+2).
func (s *story) submitSized(ctx context.Context, replicas int) error {
	return s.d.SubmitDigits(ctx, driver.Digits{Repo: s.RepoRoot, Shared: filepath.Join(s.Cluster.Dir, "shared", s.Job),
		Epochs: s.Epochs, Width: s.Width, Replicas: int32(replicas)})
}

var accRe = regexp.MustCompile(`final accuracy=([\d.]+)`)

// baseline runs the same training undisturbed with two local processes.
func (s *story) baseline(ctx context.Context) (float64, error) {
	return Undisturbed(ctx, s.RepoRoot, s.Epochs, s.Width, 2)
}

// Beside starts run (an undisturbed run, which trains beside a job and
// shares the CPUs with it: only its accuracy is compared, never its time) and
// returns what waits for its accuracy; the wait may be called more than once.
func Beside(ctx context.Context, run func(context.Context) (float64, error)) func() (float64, error) {
	type result struct {
		acc float64
		err error
	}
	done := make(chan result, 1)
	go func() {
		acc, err := run(ctx)
		done <- result{acc, err}
	}()
	return sync.OnceValues(func() (float64, error) {
		r := <-done
		return r.acc, r.err
	})
}

// baselinePort is the undisturbed run's rendezvous port: torchrun
// --standalone binds the wildcard address on 29400, the port a job's
// launcher binds on its pod IP when a run happens beside a job (etjob-local chaos).
const baselinePort = 29431

// Undisturbed runs the digits training with procs local processes and no
// cluster, and returns its final accuracy: what the stories compare with.
func Undisturbed(ctx context.Context, repo string, epochs, width, procs int) (float64, error) {
	return accuracyOf(ctx, repo, []string{"-m", "etjob.torchrun", "--nnodes=1", fmt.Sprintf("--nproc_per_node=%d", procs),
		"--rdzv_backend=c10d", fmt.Sprintf("--rdzv_endpoint=localhost:%d", baselinePort), "--rdzv_id=etjob-baseline",
		filepath.Join(repo, "examples/digits/train.py"), "--epochs", strconv.Itoa(epochs)},
		"WIDTH="+strconv.Itoa(width), etjobv1.EnvAgentAddr+"=")
}

// UndisturbedElastic runs the digits example's in-process variant,
// train_elastic.py, with procs local ranks (hack/elastic-local.py: their own
// store, no cluster) and returns its final accuracy. The example's step does
// not depend on the world size, so procs ranks compute what a job of any
// size does, up to float rounding.
func UndisturbedElastic(ctx context.Context, repo string, epochs, procs int) (float64, error) {
	return accuracyOf(ctx, repo, []string{filepath.Join(repo, "hack/elastic-local.py"), strconv.Itoa(procs),
		filepath.Join(repo, "examples/digits/train_elastic.py"), "--epochs", strconv.Itoa(epochs)})
}

// accuracyOf runs /usr/bin/python3 with args, the repository's worker library
// on its path and a checkpoint directory of its own, and returns the final
// accuracy it printed.
func accuracyOf(ctx context.Context, repo string, args []string, env ...string) (float64, error) {
	dir, err := os.MkdirTemp("", "etjob-baseline-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", args...)
	cmd.Env = append(append(os.Environ(), "PYTHONPATH="+filepath.Join(repo, "python"), etjobv1.EnvCheckpointDir+"="+dir), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("undisturbed run: %w\n%s", err, tail(string(out), 2000))
	}
	m := accRe.FindStringSubmatch(string(out))
	if m == nil {
		return 0, fmt.Errorf("the undisturbed run printed no final accuracy:\n%s", tail(string(out), 2000))
	}
	return strconv.ParseFloat(m[1], 64)
}

// meter samples, every second, which worker pods run on which node, for the cost.
func (s *story) meter(ctx context.Context) {
	last := time.Now()
	for ctx.Err() == nil {
		time.Sleep(time.Second)
		dt := time.Since(last).Seconds()
		last = time.Now()
		pods, err := s.d.Clientset.CoreV1().Pods(s.Namespace).List(ctx, metav1.ListOptions{LabelSelector: etjobv1.LabelJobName + "=" + s.Job})
		if err != nil {
			continue
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.Spec.NodeName == "" {
				continue
			}
			s.mu.Lock()
			if _, ok := s.prices[p.Spec.NodeName]; !ok {
				if n, err := s.d.Clientset.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{}); err == nil {
					s.prices[p.Spec.NodeName], _ = etjobv1.NodePrice(n)
				}
			}
			s.seconds[p.Spec.NodeName] += dt
			s.mu.Unlock()
		}
	}
}

func (s *story) collect(ctx context.Context) error {
	s.res.Wall = time.Since(s.start)
	lines, err := s.d.Logs()
	if err != nil {
		return err
	}
	s.res.Accuracy, s.res.Steps, s.res.Completed = driver.Final(lines)
	s.res.LedgerOK, s.res.LedgerDetail = driver.LedgerOK(lines)
	s.res.Resumes = driver.Resumes(lines)
	s.mu.Lock()
	for node, sec := range s.seconds {
		s.res.Cost += s.prices[node].Cost(sec / 3600)
		s.res.OnDemandCost += localcluster.OnDemandPrice.Cost(sec / 3600)
	}
	s.mu.Unlock()
	if job, err := s.d.Get(ctx); err == nil {
		s.res.Job = job
	}
	s.writeTimeline(lines)
	return nil
}

// Summary prints the result for people.
func (r *Result) Summary(w io.Writer) {
	fmt.Fprintln(w, "\n=== etjob-local demo summary ===")
	fmt.Fprintln(w, "timeline:")
	for _, l := range r.Timeline {
		fmt.Fprintln(w, "  "+l)
	}
	if r.Job != nil {
		fmt.Fprintln(w, "membership timeline (status.timeline):")
		for _, e := range r.Job.Status.Timeline {
			fmt.Fprintf(w, "  %s  %-8s gen %-3d members %d  %s\n", e.Time.Format("15:04:05"), e.Type, e.Generation, e.Members, e.Message)
		}
		fmt.Fprintf(w, "restarts %d, preemptions %d, failures %d\n", r.Job.Status.Restarts, r.Job.Status.Preemptions, r.Job.Status.Failures)
	}
	fmt.Fprintln(w, "training restarts (steps lost = steps done again):")
	for i, rs := range r.Resumes {
		how := "hard loss: back to the last periodic checkpoint"
		if rs.AfterStop {
			how = "agreed stop: checkpoint at the stop step"
		}
		fmt.Fprintf(w, "  %d. resumed at step %d with %d workers after reaching %d: %d steps lost (%s)\n", i+1, rs.From, rs.World, rs.Reached, rs.Lost, how)
	}
	fmt.Fprintf(w, "steps: %d; sampler ledger: %s\n", r.Steps, r.LedgerDetail)
	if r.BaselineAccuracy > 0 {
		fmt.Fprintf(w, "final accuracy: %.4f (undisturbed run: %.4f)\n", r.Accuracy, r.BaselineAccuracy)
	} else {
		fmt.Fprintf(w, "final accuracy: %.4f\n", r.Accuracy)
	}
	saved := 0.0
	if r.OnDemandCost > 0 {
		saved = 100 * (1 - r.Cost/r.OnDemandCost)
	}
	fmt.Fprintf(w, "wall time: %s\n", r.Wall.Round(time.Second))
	fmt.Fprintf(w, "worker cost: $%.4f on spot vs $%.4f all on-demand (p3.2xlarge $%s/h vs $%s/h): %.0f%% saved\n",
		r.Cost, r.OnDemandCost, localcluster.SpotPrice, localcluster.OnDemandPrice, saved)
}

// Waiting helpers.

func (s *story) members(ctx context.Context) int {
	j, err := s.d.Get(ctx)
	if err != nil {
		return 0
	}
	return int(j.Status.Members)
}

func (s *story) conditionMessage(ctx context.Context, t string) string {
	j, err := s.d.Get(ctx)
	if err != nil {
		return ""
	}
	if c := meta.FindStatusCondition(j.Status.Conditions, t); c != nil {
		return c.Message
	}
	return ""
}

func (s *story) waitMembers(ctx context.Context, n int, timeout time.Duration) error {
	return s.d.WaitFor(ctx, fmt.Sprintf("%d members", n), timeout, func() (bool, error) {
		j, err := s.d.Get(ctx)
		if err != nil {
			return false, err
		}
		if err := driver.Failed(j); err != nil {
			return false, err
		}
		return int(j.Status.Members) >= n, nil
	})
}

func (s *story) waitCondition(ctx context.Context, cond, reason string, timeout time.Duration) error {
	return s.d.WaitFor(ctx, "condition "+cond, timeout, func() (bool, error) {
		j, err := s.d.Get(ctx)
		if err != nil {
			return false, err
		}
		if err := driver.Failed(j); cond != etjobv1.ConditionFailed && err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(j.Status.Conditions, cond)
		return c != nil && c.Status == metav1.ConditionTrue && (reason == "" || c.Reason == reason), nil
	})
}

func (s *story) waitSteps(ctx context.Context, step int, timeout time.Duration) error {
	return s.d.WaitFor(ctx, fmt.Sprintf("training step %d", step), timeout, func() (bool, error) {
		j, err := s.d.Get(ctx)
		if err == nil {
			if err := driver.Failed(j); err != nil {
				return false, err
			}
		}
		reached := s.d.MaxStep()
		if reached < step && err == nil && meta.IsStatusConditionTrue(j.Status.Conditions, etjobv1.ConditionComplete) {
			return false, fmt.Errorf("the job completed at step %d, before step %d: the training ended before the story's next fault (give it more epochs)", reached, step)
		}
		return reached >= step, nil
	})
}

func (s *story) waitResumes(ctx context.Context, n int, timeout time.Duration) error {
	return s.d.WaitFor(ctx, fmt.Sprintf("%d training restarts", n), timeout, func() (bool, error) {
		lines, err := s.d.Logs()
		if err != nil {
			return false, err
		}
		rs := driver.Resumes(lines)
		if len(rs) < n {
			return false, nil
		}
		// Resumed means a step finished after the restart.
		for _, l := range lines {
			if l.Kind == "step" && l.T > rs[n-1].T {
				return true, nil
			}
		}
		return false, nil
	})
}

// workerNodes returns n spot nodes that run members of the job: nodes of a
// cloud not reclaimed yet (in this story or in Options.Reclaimed) first, then
// the highest worker index first. It records their clouds as reclaimed.
func (s *story) workerNodes(ctx context.Context, n int) ([]string, error) {
	j, err := s.d.Get(ctx)
	if err != nil {
		return nil, err
	}
	done := map[string]bool{}
	for _, p := range append(append([]string(nil), s.Reclaimed...), s.res.ReclaimedProviders...) {
		done[p] = true
	}
	type cand struct {
		node, provider string
		index          int32
	}
	var cs []cand
	for _, w := range j.Status.Workers {
		if w.State != etjobv1.WorkerMember || !strings.HasPrefix(w.Node, "spot-") {
			continue
		}
		node, err := s.d.Clientset.CoreV1().Nodes().Get(ctx, w.Node, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		cs = append(cs, cand{w.Node, node.Labels[etjobv1.LabelCloudProvider], w.Index})
	}
	sort.Slice(cs, func(a, b int) bool {
		if done[cs[a].provider] != done[cs[b].provider] {
			return !done[cs[a].provider]
		}
		return cs[a].index > cs[b].index
	})
	var out []string
	for _, c := range cs {
		if len(out) < n {
			out = append(out, c.node)
			s.res.ReclaimedProviders = append(s.res.ReclaimedProviders, c.provider)
			done[c.provider] = true
		}
	}
	if len(out) < n {
		return nil, fmt.Errorf("wanted %d spot nodes with members, found %v", n, out)
	}
	return out, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Submit creates the digits example's PV, PVC and ElasticJob with the given
// desired workers (min 2, max replicas+2), as the story does; `etjob-local chaos`
// drives its own schedule on it.
func Submit(ctx context.Context, o Options, replicas int) error {
	s, err := newStory(o)
	if err != nil {
		return err
	}
	return s.submitSized(ctx, replicas)
}

func newStory(o Options) (*story, error) {
	d, err := driver.New(o.Cluster, o.Namespace, o.Job, 500*time.Millisecond)
	if err != nil {
		return nil, err
	}
	return &story{Options: o, d: d, start: time.Now(), res: &Result{}, seconds: map[string]float64{}, prices: map[string]etjobv1.PricePerHour{}}, nil
}
