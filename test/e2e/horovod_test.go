package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/localcluster"
	"github.com/etjob/etjob/internal/scheme"
	"github.com/etjob/etjob/internal/testutil"
)

// The Horovod stories run real horovodrun (Horovod 0.28.1 built by
// hack/install-horovod.sh) from the seeds' own command lines, through the
// CLI, with the Horovod digits example (examples/horovod). The launcher
// reaches the workers through /etc/mpi/kubexec.sh, etjob's own exec client:
// the image's PATH starts with a kubectl that fails, so a transport that
// fell back to kubectl would fail the story.

// seed001Command is seed 001's horovodrun line as the shell hands it to
// Arena (the backslash-newlines inside its double quotes are gone), with
// only the script pointing at the example.
const seed001Command = `horovodrun     -np $((${workers}*${gpus}))     --min-np $((${minWorkers}*${gpus}))     --max-np $((${maxWorkers}*${gpus}))     --host-discovery-script /etc/edl/discover_hosts.sh     python /examples/horovod/pytorch_digits_elastic.py --epochs %d
    `

// seed000Command is seed 000's horovodrun line, with its line breaks, as
// Arena gets it, pointing at the example.
const seed000Command = `horovodrun
  -np $((${workers}*${gpus}))
  --min-np $((${minWorkers}*${gpus}))
  --max-np $((${maxWorkers}*${gpus}))
  --host-discovery-script /etc/edl/discover_hosts.sh
  python /examples/horovod/pytorch_digits_elastic.py --epochs=%d`

// seed001Epochs is the story's training length: its two resizes come
// within the first ~30 of its 22 steps an epoch (0.2 s each here), and every
// step after them is training the story only waits out (60 epochs spent
// over 3 minutes so). 15 keeps a margin of ten times over that.
const seed001Epochs = 15

func TestHorovodSeed001(t *testing.T) {
	requireHorovod(t)
	ctx := withTimeout(t, 15*time.Minute)
	e := startHorovodCluster(t, ctx, "etjob-e2e-hvd-seed001", 4)
	logs := followLaunchers(t, ctx, e, "elastic-training")

	e.cli(t, "submit", "etjob",
		"--name=elastic-training", "--gpus=1", "--workers=3", "--max-workers=9", "--min-workers=1",
		"--image=registry.cn-hangzhou.aliyuncs.com/ai-samples/horovod:0.20.0-tf2.3.0-torch1.6.0-mxnet1.6.0.post0-py3.7-cuda10.1",
		"--working-dir=/examples", fmt.Sprintf(seed001Command, seed001Epochs))

	waitFor(t, ctx, "the launcher and 3 workers Running in etjob get", 3*time.Minute, func() (bool, string) {
		out := e.cli(t, "get", "elastic-training")
		return runningInstances(out) == 4, out
	})
	waitFor(t, ctx, "ranks 0-2 in etjob logs --tail 10", 2*time.Minute, func() (bool, string) {
		out := e.cli(t, "logs", "elastic-training", "--tail", "10")
		return ranksIn(out).equal(0, 1, 2), out
	})
	launcher := podUID(t, ctx, e, "elastic-training-launcher")

	e.cli(t, "scaleout", "etjob", "--name=elastic-training", "--count=1", "--timeout=10m")
	waitFor(t, ctx, "a 4th rank's step lines", 2*time.Minute, func() (bool, string) {
		out := e.cli(t, "logs", "elastic-training", "--tail", "10")
		return ranksIn(out).has(3) && lastWorld(logs.text()) == 4, out
	})
	e.cli(t, "scalein", "etjob", "--name=elastic-training", "--count=1", "--timeout=10m")
	waitFor(t, ctx, "back to 3 ranks", 2*time.Minute, func() (bool, string) {
		out := e.cli(t, "logs", "elastic-training", "--tail", "10")
		return ranksIn(out).equal(0, 1, 2) && lastWorld(logs.text()) == 3, out
	})
	if got := podUID(t, ctx, e, "elastic-training-launcher"); got != launcher {
		t.Errorf("the launcher was replaced during the resizes (%s -> %s): a job restart", launcher, got)
	}
	job := waitFinished(t, ctx, e, "elastic-training", 2*time.Minute, logs)
	if !meta.IsStatusConditionTrue(job.Status.Conditions, etjobv1.ConditionComplete) || job.Status.Restarts != 0 || job.Status.Failures != 0 {
		t.Errorf("want Complete with no restart and no failure: restarts %d, failures %d, conditions %+v",
			job.Status.Restarts, job.Status.Failures, job.Status.Conditions)
	}
	run := parseHorovodLog(logs.text())
	for _, tr := range run.transitions {
		t.Logf("resize: world %d -> %d after step %d, resumed at step %d: pause %.2f s, %d steps done again",
			tr.fromWorld, tr.toWorld, tr.before.step, tr.after.step, tr.pause(), tr.redone())
		if tr.redone() != 0 {
			t.Errorf("a resize did %d steps again (world %d -> %d)", tr.redone(), tr.fromWorld, tr.toWorld)
		}
	}
	if !strings.Contains(logs.text(), "ledger ok") {
		t.Errorf("the sampler ledger is not exact:\n%s", tail(logs.text(), 40))
	}
}

func TestHorovodSpotStory(t *testing.T) {
	requireHorovod(t)
	ctx := withTimeout(t, 20*time.Minute)
	// Its last change, the burst below min, comes near step 200 of 880
	// (22 steps an epoch, 0.1 s each here): a margin of four times, where 90
	// epochs spent about 3 minutes on training after the story's last check.
	const epochs = 40
	// The undisturbed run trains while the cluster comes up and the job
	// starts (it is needed only at the end).
	baseline := make(chan undisturbed, 1)
	go func() {
		acc, steps, err := undisturbedAccuracy(ctx, epochs)
		baseline <- undisturbed{acc, steps, err}
	}()
	e := startHorovodCluster(t, ctx, "etjob-e2e-hvd-spot", 4)
	logs := followLaunchers(t, ctx, e, "fine-tuning-elastic")
	checkpointClaim(t, ctx, e, "hvd-ckpt")

	// Seed 000's submit, sized for 2 cores (3 workers, min 2, max 4), with
	// a checkpoint directory on the claim.
	e.cli(t, "submit", "etjob", "--spot-instance", "--max-wait-time=600",
		"--job-restart-policy=OnFailure", "--job-backoff-limit=3", "--worker-restart-policy=Always",
		"--namespace=default", "--name=fine-tuning-elastic", "--gpus=1",
		"--workers=3", "--max-workers=4", "--min-workers=2", "-d", "hvd-ckpt:/ckpt", "--checkpoint-dir", "/ckpt",
		"--image=registry.cn-beijing.aliyuncs.com/acs/bert-elastic-demo:v1.5",
		fmt.Sprintf(seed000Command, epochs))
	waitStep := func(what string, n int) {
		waitFor(t, ctx, what, 4*time.Minute, func() (bool, string) {
			r := parseHorovodLog(logs.text())
			return r.lastStep() >= n, tail(logs.text(), 20)
		})
	}
	waitWorld := func(what string, world int) {
		waitFor(t, ctx, what, 3*time.Minute, func() (bool, string) {
			return lastWorld(logs.text()) == world, tail(logs.text(), 20)
		})
	}
	waitStep("training", 60)

	// 1. A noticed reclaim of one worker's node: its rank hears it from its
	// own node's agent, Horovod resets the others without it at a commit,
	// and the job's replacement joins on the free node.
	noticedNode, noticedIP := workerNode(t, ctx, e, "fine-tuning-elastic-worker-1")
	reclaimAsync(t, ctx, e, noticedNode, 20*time.Second)
	waitFor(t, ctx, "the noticed rank told by its own node's agent", time.Minute, func() (bool, string) {
		return regexp.MustCompile(`<stderr>:etjob\.supervisor: node agent ` + regexp.QuoteMeta(noticedIP) + `:\d+ says leave \(ReclaimNotice`).MatchString(logs.text()), tail(logs.text(), 20)
	})
	if strings.Contains(logs.text(), "node agent "+launcherNodeIP(t, ctx, e, "fine-tuning-elastic")) {
		t.Errorf("a rank asked the launcher's node agent: horovodrun copied the launcher's identity into it")
	}
	noticedAt := time.Now()
	waitFor(t, ctx, "Horovod's reset without the noticed host, and world 3 again", 3*time.Minute, func() (bool, string) {
		r := parseHorovodLog(logs.text())
		return len(r.transitionsAfter(noticedAt.Add(-5*time.Second))) >= 1 && lastWorld(logs.text()) == 3, tail(logs.text(), 20)
	})
	waitStep("training after the noticed loss", parseHorovodLog(logs.text()).lastStep()+30)

	// 2. A hard loss (no notice): Horovod blacklists the host and goes on.
	hardNode, _ := workerNode(t, ctx, e, survivingWorker(t, ctx, e, "fine-tuning-elastic", noticedNode))
	hardAt := time.Now()
	if err := e.Reclaim(ctx, hardNode, 0); err != nil {
		t.Fatal(err)
	}
	waitWorld("training on after the hard loss", 2)
	waitStep("training after the hard loss", parseHorovodLog(logs.text()).lastStep()+30)

	// 3. A burst below min: both remaining workers' nodes noticed at once,
	// and two new nodes added at the same moment, so that their workers are
	// ready while the old ranks still stop (the race that failed this story
	// twice: a new host set with none of horovodrun's own). Every rank stops
	// at one agreed step after rank 0's checkpoint, the job waits for
	// capacity, and a new horovodrun resumes from that checkpoint with the
	// new workers; the old one's exit is a release.
	var burst []string
	for _, w := range liveWorkers(t, ctx, e, "fine-tuning-elastic") {
		n, _ := workerNode(t, ctx, e, w)
		burst = append(burst, n)
	}
	for _, n := range burst {
		reclaimAsync(t, ctx, e, n, 20*time.Second)
	}
	for range 2 {
		if _, err := e.AddNode(ctx, "", true); err != nil {
			t.Fatal(err)
		}
	}
	waitCondition(t, ctx, e, "fine-tuning-elastic", etjobv1.ConditionSuspended, etjobv1.ReasonWaitingForCapacity, 2*time.Minute, logs)
	// The condition is set when the stop is ordered; the ranks print their
	// stop lines once they reached the agreed step.
	waitFor(t, ctx, "the ranks' agreed stop", time.Minute, func() (bool, string) {
		return agreedStopLine.MatchString(logs.text()), tail(logs.text(), 20)
	})
	stopStep := agreedStop(t, logs.text())
	waitFor(t, ctx, "the resume from the stop's checkpoint", 3*time.Minute, func() (bool, string) {
		return regexp.MustCompile(fmt.Sprintf(`resume step=%d world=\d+`, stopStep)).MatchString(logs.text()), tail(logs.text(), 20)
	})

	job := waitFinished(t, ctx, e, "fine-tuning-elastic", 2*time.Minute, logs)
	run := parseHorovodLog(logs.text())
	if !meta.IsStatusConditionTrue(job.Status.Conditions, etjobv1.ConditionComplete) {
		t.Fatalf("the job did not complete: %+v\n%s", job.Status.Conditions, tail(logs.text(), 40))
	}
	if job.Status.Failures != 0 {
		t.Errorf("failures %d: a noticed loss, a hard loss and a stop below min are not failures", job.Status.Failures)
	}
	if strings.Contains(logs.text(), "No hosts from previous set remaining") {
		t.Errorf("horovodrun was given a host set with none of its own hosts:\n%s", tail(logs.text(), 40))
	}
	hardSeen := false
	for _, tr := range run.transitions {
		// The hard loss's transition is the first one after the kill.
		hard := !hardSeen && tr.after.at.After(hardAt)
		hardSeen = hardSeen || hard
		t.Logf("transition world %d -> %d (launcher %d -> %d) after step %d at %.2f, resumed at step %d: pause %.2f s, %d steps done again (hard %v)",
			tr.fromWorld, tr.toWorld, tr.before.launcher, tr.after.launcher, tr.before.step, float64(tr.before.at.UnixMilli())/1000,
			tr.after.step, tr.pause(), tr.redone(), hard)
		if !hard && tr.redone() != 0 {
			t.Errorf("a noticed change did %d steps again (world %d -> %d after step %d)", tr.redone(), tr.fromWorld, tr.toWorld, tr.before.step)
		}
		if hard && tr.redone() > 1 {
			t.Errorf("the hard loss did %d steps again; Horovod restores the last commit, one step back at most", tr.redone())
		}
	}
	if !strings.Contains(logs.text(), "ledger ok") {
		t.Errorf("the sampler ledger is not exact:\n%s", tail(logs.text(), 40))
	}
	base := <-baseline
	if base.err != nil {
		t.Fatalf("the undisturbed run: %v", base.err)
	}
	t.Logf("undisturbed run: accuracy %.4f after %d steps", base.accuracy, base.steps)
	if math.Abs(run.accuracy-base.accuracy) > 0.01 {
		t.Errorf("final accuracy %.4f is not within 1 point of the undisturbed run's %.4f", run.accuracy, base.accuracy)
	}
	t.Logf("final accuracy %.4f (undisturbed %.4f), %d steps, restarts %d, preemptions %d", run.accuracy, base.accuracy, run.lastStep(), job.Status.Restarts, job.Status.Preemptions)
}

// TestHorovodBadInput: each mistake gets a clear condition and Event within
// 60 s, not horovodrun's 600 s --elastic-timeout.
func TestHorovodBadInput(t *testing.T) {
	requireHorovod(t)
	ctx := withTimeout(t, 10*time.Minute)
	e := startHorovodCluster(t, ctx, "etjob-e2e-hvd-bad", 2)
	c := e.client(t)
	cases := map[string]struct {
		image, command string
		want           *regexp.Regexp
	}{
		"no-horovodrun": {image: "etjob/digits:local", command: "python /examples/horovod/pytorch_digits_elastic.py",
			want: regexp.MustCompile(`must run horovodrun`)},
		"bad-discovery": {image: "etjob/digits:local", command: "horovodrun -np 2 --host-discovery-script /etc/edl/discover.sh python /examples/horovod/pytorch_digits_elastic.py",
			want: regexp.MustCompile(`--host-discovery-script /etc/edl/discover\.sh does not exist`)},
		"no-horovod": {image: noHorovodImage, command: "horovodrun -np 2 --host-discovery-script /etc/edl/discover_hosts.sh python /examples/horovod/pytorch_digits_elastic.py",
			want: regexp.MustCompile(`exit code 127.*horovodrun: not found`)},
	}
	for name, tc := range cases {
		job := horovodJob(name, tc.image, tc.command)
		start := time.Now()
		if err := c.Create(ctx, job); err != nil {
			t.Fatal(err)
		}
		var got etjobv1.ElasticJob
		waitFor(t, ctx, name+": a Failed condition naming the problem", 60*time.Second, func() (bool, string) {
			if err := c.Get(ctx, client.ObjectKeyFromObject(job), &got); err != nil {
				return false, err.Error()
			}
			cnd := meta.FindStatusCondition(got.Status.Conditions, etjobv1.ConditionFailed)
			return cnd != nil && cnd.Status == metav1.ConditionTrue && tc.want.MatchString(cnd.Message), fmt.Sprintf("%+v", got.Status.Conditions)
		})
		// The controller's Events are sent after its status write, by the
		// recorder's own goroutine: the Event may come a moment after the
		// condition (one CI run listed the Events before it).
		waitFor(t, ctx, name+": a Warning Event that says why", 30*time.Second, func() (bool, string) {
			var events corev1.EventList
			if err := c.List(ctx, &events, client.InNamespace("default")); err != nil {
				return false, err.Error()
			}
			return slices.ContainsFunc(events.Items, func(ev corev1.Event) bool {
				return ev.InvolvedObject.Name == name && ev.Type == corev1.EventTypeWarning && tc.want.MatchString(ev.Message)
			}), fmt.Sprintf("%d Events in the namespace", len(events.Items))
		})
		t.Logf("%s: failed after %.1f s: %s", name, time.Since(start).Seconds(), meta.FindStatusCondition(got.Status.Conditions, etjobv1.ConditionFailed).Message)
	}
}

// --- the cluster -----------------------------------------------------------

// noHorovodImage is an image without Horovod on the e2e cluster.
const noHorovodImage = "etjob/no-horovod:local"

func requireHorovod(t *testing.T) {
	t.Helper()
	if os.Getenv("ETJOB_SKIP_E2E") != "" {
		t.Skip("ETJOB_SKIP_E2E is set")
	}
	if localcluster.HorovodVenv() == "" {
		t.Fatal("Horovod is not installed: run hack/install-horovod.sh (make test does)")
	}
}

// startHorovodCluster starts a cluster of spot GPU nodes and one on-demand
// node whose images run the local image with Horovod, except
// noHorovodImage, and whose PATH starts with a kubectl that fails.
func startHorovodCluster(t *testing.T, ctx context.Context, name string, spot int) *e2eCluster {
	t.Helper()
	stub := filepath.Join(t.TempDir(), "bin")
	if err := os.MkdirAll(stub, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho 'kubectl was called in a pod: the launcher image must not need it' >&2\nexit 97\n"
	if err := os.WriteFile(filepath.Join(stub, "kubectl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	repo := repoRoot(t)
	images := localcluster.LocalImages(repo, localcluster.HorovodVenv())
	plain := localcluster.LocalImages(repo, "")[0]
	plain.Image = noHorovodImage
	images[0].Env["PATH"] = stub + ":" + images[0].Env["PATH"]
	plain.Env["PATH"] = stub + ":" + plain.Env["PATH"]
	return startClusterWith(t, ctx, name, spot, 1, append(images, plain))
}

// cli runs the etjob binary against the cluster and returns its output.
func (e *e2eCluster) cli(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(e.bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.Kubeconfig())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("etjob %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (e *e2eCluster) client(t *testing.T) client.Client {
	t.Helper()
	cfg, err := e.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func horovodJob(name, image, command string) *etjobv1.ElasticJob {
	one := resource.MustParse("1")
	return &etjobv1.ElasticJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: etjobv1.ElasticJobSpec{
			Replicas: 2, MinReplicas: 2, MaxReplicas: 2, Framework: etjobv1.FrameworkHorovod,
			WorkerTemplate: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "worker", Image: image, Command: []string{"sh", "-c", `trap 'exit 75' TERM INT; while :; do sleep 3600 & wait $!; done`},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": one}},
			}}}},
			LauncherTemplate: &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "launcher", Image: image, WorkingDir: "/examples", Command: []string{"sh", "-c", command},
			}}}},
		},
	}
}

func checkpointClaim(t *testing.T, ctx context.Context, e *e2eCluster, name string) {
	t.Helper()
	c := e.client(t)
	dir := filepath.Join(e.Dir, "shared", name)
	hostType := corev1.HostPathDirectoryOrCreate
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &hostType}},
		},
	}
	empty := ""
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, StorageClassName: &empty, VolumeName: name,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	for _, o := range []client.Object{pv, pvc} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}

// undisturbed is what undisturbedAccuracy returns, sent from a goroutine.
type undisturbed struct {
	accuracy float64
	steps    int
	err      error
}

// undisturbedAccuracy trains the example once on this machine, one Horovod
// process without horovodrun, etjob or disturbance, and returns its
// accuracy and steps. The example's step does not depend on the world size,
// so one rank computes what three do (up to float rounding), in less time.
func undisturbedAccuracy(ctx context.Context, epochs int) (float64, int, error) {
	venv := localcluster.HorovodVenv()
	repo, err := testutil.RepoRoot()
	if err != nil {
		return 0, 0, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(venv, "bin", "python3"),
		filepath.Join(repo, "examples/horovod/pytorch_digits_elastic.py"), "--epochs", strconv.Itoa(epochs))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repo, "python"), "ETJOB_CHECKPOINT_DIR=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("%w\n%s", err, tail(string(out), 30))
	}
	r := parseHorovodLog(string(out))
	if r.accuracy == 0 {
		return 0, 0, fmt.Errorf("it printed no accuracy:\n%s", tail(string(out), 30))
	}
	return r.accuracy, r.lastStep(), nil
}

// --- launcher logs ---------------------------------------------------------

// launcherLogs holds the logs of every launcher of a job (a restart makes a
// new one), streamed from the API as they come, in the order the launchers
// appeared.
type launcherLogs struct {
	mu   sync.Mutex
	logs []*strings.Builder
}

func (l *launcherLogs) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for i, s := range l.logs {
		fmt.Fprintf(&b, "=== launcher %d\n%s", i, s.String())
	}
	return b.String()
}

// steps counts the step lines (a rank's step, or a resume) printed so far.
func (l *launcherLogs) steps() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.logs {
		n += strings.Count(s.String(), "step=")
	}
	return n
}

func followLaunchers(t *testing.T, ctx context.Context, e *e2eCluster, job string) *launcherLogs {
	t.Helper()
	cs, err := e.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	l := &launcherLogs{}
	seen := map[types.UID]bool{}
	go func() {
		for ctx.Err() == nil {
			pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: etjobv1.LabelJobName + "=" + job + "," + etjobv1.LabelRole + "=" + etjobv1.RoleLauncher})
			if err == nil {
				for _, p := range pods.Items {
					if !seen[p.UID] && (p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
						seen[p.UID] = true
						b := &strings.Builder{}
						l.mu.Lock()
						l.logs = append(l.logs, b)
						l.mu.Unlock()
						go streamLog(ctx, cs, p.Name, l, b)
					}
				}
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()
	t.Cleanup(func() {
		if t.Failed() {
			// The cluster directory is kept when a test fails: the whole
			// logs go there, rank 0's step lines left out of the tail.
			path := filepath.Join(e.Dir, "launchers.log")
			_ = os.WriteFile(path, []byte(l.text()), 0o644)
			var keep []string
			for _, line := range strings.Split(l.text(), "\n") {
				if !stepLine.MatchString(line) {
					keep = append(keep, line)
				}
			}
			t.Logf("launcher logs without the step lines (end; all of them in %s):\n%s", path, tail(strings.Join(keep, "\n"), 150))
		}
	})
	return l
}

func streamLog(ctx context.Context, cs *kubernetes.Clientset, pod string, l *launcherLogs, b *strings.Builder) {
	rc, err := cs.CoreV1().Pods("default").GetLogs(pod, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	if err != nil {
		return
	}
	defer rc.Close()
	r := bufio.NewReader(rc)
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			l.mu.Lock()
			b.WriteString(line)
			l.mu.Unlock()
		}
		if err == io.EOF || err != nil {
			return
		}
	}
}

// --- reading Horovod's output ------------------------------------------------

var (
	stepLine   = regexp.MustCompile(`(?m)^\[(\d+)\]<stdout>:step=(\d+) epoch=\d+ rank=(\d+) world=(\d+) loss=\S+ t=([\d.]+)$`)
	plainStep  = regexp.MustCompile(`(?m)^step=(\d+) epoch=\d+ rank=(\d+) world=(\d+) loss=\S+ t=([\d.]+)$`)
	accuracyRe = regexp.MustCompile(`final accuracy=([\d.]+)`)
	launcherRe = regexp.MustCompile(`(?m)^=== launcher (\d+)$`)
	// why=reset: a rank told to stop while the reset of a host update
	// waited for hosts that discovery no longer lists (the job fell below
	// its minimum during the reset) stops from the commit it reset at.
	agreedStopLine = regexp.MustCompile(`<stdout>:stop step=(\d+) rank=\d+ reason=\S+ why=(?:job|reset)`)
	resetLine      = regexp.MustCompile(`(?m)^(\[\d+\]<stdout>:)?reset step=\d+ world=\d+ t=`)
)

// hvdStep is one step line of rank 0.
type hvdStep struct {
	step, world, launcher int
	at                    time.Time
}

// transition is a change of rank 0's world (a resize) or of launcher (a
// restart): the last step before and the first after.
type transition struct {
	fromWorld, toWorld int
	before, after      hvdStep
}

// pause is the time between the last step before and the first after.
func (tr transition) pause() float64 { return tr.after.at.Sub(tr.before.at).Seconds() }

// redone is how many steps were done again: 0 when training went on at the
// next step.
func (tr transition) redone() int { return max(tr.before.step-tr.after.step+1, 0) }

type hvdRun struct {
	steps       []hvdStep
	transitions []transition
	accuracy    float64
}

func (r hvdRun) lastStep() int {
	if len(r.steps) == 0 {
		return 0
	}
	return r.steps[len(r.steps)-1].step
}

func (r hvdRun) transitionsAfter(at time.Time) []transition {
	var out []transition
	for _, tr := range r.transitions {
		if tr.after.at.After(at) {
			out = append(out, tr)
		}
	}
	return out
}

func parseHorovodLog(text string) hvdRun {
	var r hvdRun
	launcher, reset := 0, false
	for _, line := range strings.Split(text, "\n") {
		if m := launcherRe.FindStringSubmatch(line); m != nil {
			launcher, _ = strconv.Atoi(m[1])
			continue
		}
		if resetLine.MatchString(line) {
			// A reset that kept the world size (a host left and its
			// replacement joined at once) is a transition too.
			reset = true
			continue
		}
		var step, rank, world int
		var ts float64
		if m := stepLine.FindStringSubmatch(line); m != nil {
			step, _ = strconv.Atoi(m[2])
			rank, _ = strconv.Atoi(m[3])
			world, _ = strconv.Atoi(m[4])
			ts, _ = strconv.ParseFloat(m[5], 64)
		} else if m := plainStep.FindStringSubmatch(line); m != nil {
			step, _ = strconv.Atoi(m[1])
			rank, _ = strconv.Atoi(m[2])
			world, _ = strconv.Atoi(m[3])
			ts, _ = strconv.ParseFloat(m[4], 64)
		} else {
			if m := accuracyRe.FindStringSubmatch(line); m != nil {
				r.accuracy, _ = strconv.ParseFloat(m[1], 64)
			}
			continue
		}
		if rank != 0 {
			continue
		}
		s := hvdStep{step: step, world: world, launcher: launcher, at: time.UnixMilli(int64(ts * 1000))}
		if n := len(r.steps); n > 0 {
			prev := r.steps[n-1]
			if reset || prev.world != s.world || prev.launcher != s.launcher || s.step <= prev.step {
				r.transitions = append(r.transitions, transition{fromWorld: prev.world, toWorld: s.world, before: prev, after: s})
			}
		}
		reset = false
		r.steps = append(r.steps, s)
	}
	return r
}

func lastWorld(text string) int {
	r := parseHorovodLog(text)
	if len(r.steps) == 0 {
		return 0
	}
	return r.steps[len(r.steps)-1].world
}

// agreedStop returns the step of the stop below min: every rank printed
// `stop step=S ... why=job` (or why=reset) for one S.
func agreedStop(t *testing.T, text string) int {
	t.Helper()
	ms := agreedStopLine.FindAllStringSubmatch(text, -1)
	if len(ms) == 0 {
		t.Fatalf("no rank stopped at an agreed step below min:\n%s", tail(text, 60))
	}
	step := ms[0][1]
	for _, m := range ms {
		if m[1] != step {
			t.Errorf("the ranks stopped at different steps: %v", ms)
		}
	}
	n, _ := strconv.Atoi(step)
	if !regexp.MustCompile(fmt.Sprintf(`checkpoint step=%d why=stop`, n)).MatchString(text) {
		t.Errorf("no checkpoint of the stop step %d", n)
	}
	return n
}

type rankSet map[int]bool

func ranksIn(out string) rankSet {
	s := rankSet{}
	for _, m := range regexp.MustCompile(`(?m)^\[(\d+)\]<stdout>:step=`).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		s[n] = true
	}
	return s
}

func (s rankSet) has(r int) bool { return s[r] }

func (s rankSet) equal(ranks ...int) bool {
	if len(s) != len(ranks) {
		return false
	}
	for _, r := range ranks {
		if !s[r] {
			return false
		}
	}
	return true
}

// runningInstances counts the Running rows of `etjob get`'s instance table.
func runningInstances(out string) int {
	return len(regexp.MustCompile(`(?m)^\s+\S+-(launcher|worker-\d+)\s+Running\s`).FindAllString(out, -1))
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
