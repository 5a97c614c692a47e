package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/driver"
	"github.com/etjob/etjob/internal/localcluster"
	"github.com/etjob/etjob/internal/localcluster/processnode"
	"github.com/etjob/etjob/internal/testutil"
)

// TestCLIStory drives a spot story through the etjob CLI only, with Arena's
// spellings where Arena has them: submit, get, logs, scaleout, a reclamation,
// add-node, scalein, the launcher's node reclaimed, completion, delete. The training logs then show that no
// committed step was lost.
func TestCLIStory(t *testing.T) {
	ctx := withTimeout(t, 20*time.Minute)
	e := startCluster(t, ctx, "etjob-e2e-cli", 4, 1)
	cl, repo, bin, local, dir := e.Cluster, e.repo, e.bin, e.local, e.Dir
	ckpt := filepath.Join(dir, "shared", "ckpt")
	if err := os.MkdirAll(ckpt, 0o755); err != nil {
		t.Fatal(err)
	}
	etjob := func(args ...string) (string, error) {
		t.Helper()
		// Connection flags first: everything from submit's COMMAND on is the command.
		cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", cl.Kubeconfig()}, args...)...)
		if args[0] == "cluster" {
			cmd = exec.CommandContext(ctx, local, append(args, "--dir", dir)...)
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		t.Logf("$ etjob %s\n%s", strings.Join(args, " "), strings.TrimSpace(out.String()))
		return out.String(), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := etjob(args...)
		if err != nil {
			t.Fatalf("etjob %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	getJob := func() *etjobv1.ElasticJob {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, "get", "digits-cli", "-o", "json", "--kubeconfig", cl.Kubeconfig())
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("etjob get -o json: %v", err)
		}
		j := &etjobv1.ElasticJob{}
		if err := json.Unmarshal(out, j); err != nil {
			t.Fatalf("etjob get -o json printed no ElasticJob: %v\n%s", err, out)
		}
		return j
	}
	waitFor := func(what string, timeout time.Duration, ok func(*etjobv1.ElasticJob) bool) *etjobv1.ElasticJob {
		t.Helper()
		var j *etjobv1.ElasticJob
		testutil.EventuallyEvery(t, time.Second, timeout, what, func() (bool, string) {
			j = getJob()
			return ok(j), fmt.Sprintf("%+v", j.Status)
		})
		return j
	}

	must("submit", "etjob", "--name=digits-cli", "--workers=3", "--min-workers=2", "--max-workers=4", "--gpus=1",
		"--spot-instance", "--image=etjob/digits:local", "--data-dir", repo+":/opt/etjob", "--data-dir", ckpt+":/ckpt",
		"--checkpoint-dir=/ckpt", "-e", "PATH=/usr/bin:/bin", "-e", "PYTHONPATH=/opt/etjob/python", "-e", "EPOCHS=60", "-e", "WIDTH=64",
		"python3 -m etjob.torchrun /opt/etjob/examples/digits/train.py")
	waitFor("3 members", testutil.LongTimeout, func(j *etjobv1.ElasticJob) bool { return j.Status.Members == 3 })
	out := must("get", "digits-cli")
	for _, want := range []string{"Name:", "digits-cli", "Trainer:", "ETJOB", "Instances:", "IS_CHIEF", "GPU(Requested)"} {
		if !strings.Contains(out, want) {
			t.Errorf("etjob get lacks %q", want)
		}
	}
	testutil.EventuallyEvery(t, 2*time.Second, 3*time.Minute, "etjob logs to show prefixed step lines", func() (bool, string) {
		out, _ = etjob("logs", "digits-cli", "--tail", "3")
		return strings.Contains(out, "[worker-") && strings.Contains(out, "step="), out
	})

	// Arena's scale-out: a ScaleOut request, done when the new worker is a member.
	must("scaleout", "etjob", "--name=digits-cli", "--count=1", "--timeout=4m")
	waitFor("4 members", time.Minute, func(j *etjobv1.ElasticJob) bool { return j.Status.Members == 4 })

	// A spot node is reclaimed with a notice: the job shrinks in place, then
	// grows back on a new node.
	// Its cloud is one the other stories have not reclaimed yet, when it can be.
	cs, err := cl.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	// spotMembers are the job's members on spot nodes, with their node's cloud.
	type member struct{ pod, node, provider string }
	spotMembers := func() []member {
		t.Helper()
		var out []member
		for _, w := range getJob().Status.Workers {
			if w.State != etjobv1.WorkerMember || !strings.HasPrefix(w.Node, "spot-") {
				continue
			}
			node, err := cs.CoreV1().Nodes().Get(ctx, w.Node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, member{w.Name, w.Node, node.Labels[etjobv1.LabelCloudProvider]})
		}
		return out
	}
	victim, provider := "", ""
	done := reclaimedProviders()
	for _, m := range spotMembers() {
		if victim == "" || (slices.Contains(done, provider) && !slices.Contains(done, m.provider)) {
			victim, provider = m.node, m.provider
		}
	}
	must("cluster", "reclaim", victim, "--notice", "15s")
	recordReclaims(provider)
	must("cluster", "add-node", "--spot")
	waitFor("4 members again", 4*time.Minute, func(j *etjobv1.ElasticJob) bool { return j.Status.Members == 4 })

	// A 60 s notice: the noticed worker trains through it (issue #14), a
	// member until deadline - (checkpoint time + the 15 s margin), then
	// every rank stops at one agreed step before the deadline, and no step is
	// lost.
	// The victim is the longest-serving member on a cloud whose notice
	// carries its own deadline (AWS, Alibaba; GCP's and Azure's are 30 s
	// whatever --notice says, less than the checkpoint time + the margin).
	must("cluster", "add-node", "--spot")
	victim, victimPod := "", ""
	for _, m := range spotMembers() {
		if (m.provider == "aws" || m.provider == "alibaba") && victim == "" {
			victim, victimPod = m.node, m.pod
		}
	}
	if victim == "" {
		t.Fatalf("no member runs on an AWS or Alibaba node: %+v", getJob().Status.Workers)
	}
	noticeAt := time.Now()
	deadlineAt := noticeAt.Add(60 * time.Second)
	reclaimedSpot := make(chan error, 1)
	go func() {
		_, err := etjob("cluster", "reclaim", victim, "--notice", "60s")
		reclaimedSpot <- err
	}()
	// Mid-notice the worker is still a member, with the stop lead the
	// controller gave it: its checkpoint time + the margin.
	time.Sleep(25 * time.Second)
	if mid := getJob(); mid.Status.Members != 4 {
		t.Errorf("25 s into a 60 s notice the job has %d members, want 4: the noticed %s trains on until its stop time", mid.Status.Members, victimPod)
	}
	var lead time.Duration
	if pod, err := cs.CoreV1().Pods("default").Get(ctx, victimPod, metav1.GetOptions{}); err != nil {
		t.Errorf("the noticed %s: %v", victimPod, err)
	} else if n, err := strconv.Atoi(pod.Annotations[etjobv1.AnnotationStopLead]); err != nil || n < 15 {
		t.Errorf("the noticed %s has stop lead %q, want the checkpoint time + the 15 s margin", victimPod, pod.Annotations[etjobv1.AnnotationStopLead])
	} else {
		lead = time.Duration(n) * time.Second
	}
	if err := <-reclaimedSpot; err != nil {
		t.Fatalf("etjob-local cluster reclaim %s: %v", victim, err)
	}
	lines, err := driver.ReadLogs(dir, "default", "digits-cli")
	if err != nil {
		t.Fatal(err)
	}
	// The noticed worker's last step before its deadline, and the agreed
	// stop that ended it (the first after it; a join's restart may stop the
	// ranks once before).
	secs := func(at time.Time) float64 { return float64(at.UnixNano()) / 1e9 }
	var lastStep, stop *driver.LogLine
	for i, l := range lines {
		if l.Kind == "step" && l.Pod == victimPod && l.T >= secs(noticeAt) && l.T <= secs(deadlineAt) {
			lastStep = &lines[i]
		}
	}
	for i, l := range lines {
		if l.Kind == "stop" && lastStep != nil && l.T >= lastStep.T && l.T <= secs(deadlineAt) {
			stop = &lines[i]
			break
		}
	}
	switch {
	case lastStep == nil || stop == nil:
		t.Errorf("no step of %s (%v) or no agreed stop (%v) between the notice and its deadline; the workers' logs end:\n%s",
			victimPod, lastStep, stop, podLogTails(dir, "default", "digits-cli-worker-", 12))
	case lead > 0:
		// The agent's deadline is whole seconds (RFC 3339): the stop time
		// is deadline - lead, up to a second earlier.
		stopAt := secs(deadlineAt.Add(-lead)) - 1
		t.Logf("lead time: %s trained %.1fs into its 60 s notice; stop lead %s; the agreed stop at step %d came %.1fs after the notice, %.1fs before the deadline",
			victimPod, lastStep.T-secs(noticeAt), lead, stop.Step, stop.T-secs(noticeAt), secs(deadlineAt)-stop.T)
		if lastStep.T < stopAt-1 || stop.T < stopAt {
			t.Errorf("the noticed worker stopped training before deadline - its stop lead: last step %.1fs, stop %.1fs after the notice, stop time %.1fs",
				lastStep.T-secs(noticeAt), stop.T-secs(noticeAt), stopAt-secs(noticeAt))
		}
		if lastStep.Step > stop.Step {
			t.Errorf("%s trained step %d past the agreed stop step %d", victimPod, lastStep.Step, stop.Step)
		}
	}
	waitFor("4 members after the 60 s notice", 4*time.Minute, func(j *etjobv1.ElasticJob) bool { return j.Status.Members == 4 })

	// Arena's scale-in, while the job trains (once the job is done, a
	// scale-in is refused with its state).
	must("scalein", "etjob", "--name=digits-cli", "--count=1", "--timeout=4m")

	// The launcher's node is reclaimed: the rendezvous store moves. Every
	// worker checkpoints at the agreed step and stops, the job restarts with a
	// new launcher on other on-demand capacity, and resumes from that step;
	// nothing counts as a failure.
	must("cluster", "add-node")
	launcher, err := cs.CoreV1().Pods("default").Get(ctx, "digits-cli-launcher", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// `cluster reclaim` returns at the deadline, 30 s on, when the job may
	// have moved and finished already: watch the move while it waits.
	reclaimed := make(chan error, 1)
	go func() {
		_, err := etjob("cluster", "reclaim", launcher.Spec.NodeName, "--notice", "30s")
		reclaimed <- err
	}()
	// The new launcher's node is read while the job runs on it: the job may
	// finish, and its launcher go, before the reclaim returns.
	var moved *corev1.Pod
	waitFor("the store moved: 1 restart, 3 members", 4*time.Minute, func(j *etjobv1.ElasticJob) bool {
		if j.Status.Restarts != 1 || j.Status.Members != 3 {
			return false
		}
		l, err := cs.CoreV1().Pods("default").Get(ctx, "digits-cli-launcher", metav1.GetOptions{})
		moved = l
		return err == nil
	})
	if moved.Spec.NodeName == launcher.Spec.NodeName {
		t.Errorf("the new launcher is on %q, want a node other than the reclaimed %s", moved.Spec.NodeName, launcher.Spec.NodeName)
	}
	if err := <-reclaimed; err != nil {
		t.Fatalf("etjob-local cluster reclaim %s: %v", launcher.Spec.NodeName, err)
	}

	j := waitFor("completion", 15*time.Minute, func(j *etjobv1.ElasticJob) bool { return j.Status.CompletionTime != nil })
	if out := must("get", "digits-cli"); !strings.Contains(out, "SUCCEEDED") {
		t.Errorf("etjob get after completion:\n%s", out)
	}
	if j.Status.Failures != 0 || j.Status.Preemptions < 2 || j.Status.Restarts != 1 {
		t.Errorf("failures %d preemptions %d restarts %d: the reclaimed worker and the moved launcher are preemptions, the move one restart",
			j.Status.Failures, j.Status.Preemptions, j.Status.Restarts)
	}
	lines, err = driver.ReadLogs(dir, "default", "digits-cli")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := driver.Final(lines); !ok {
		t.Fatal("training did not finish")
	}
	if ok, detail := driver.LedgerOK(lines); !ok {
		t.Errorf("sampler ledger: %s", detail)
	}
	for i, r := range driver.Resumes(lines) {
		if r.Lost != 0 {
			t.Errorf("restart %d (resumed at %d after reaching %d) lost %d committed steps", i+1, r.From, r.Reached, r.Lost)
		}
	}
	// The bill (status.cost) against the local cluster's own record: each
	// node's billing ledger of its pods' start and end, times its price; and
	// the on-demand equivalent, those hours at the on-demand price.
	want, hours := ledgerCost(t, dir, "default", "digits-cli-worker-")
	if c := j.Status.Cost; c == nil {
		t.Errorf("no status.cost; the nodes' ledgers say $%.6f", want)
	} else {
		got, _ := strconv.ParseFloat(c.Cost, 64)
		onDemand, _ := strconv.ParseFloat(c.OnDemandCost, 64)
		wantOnDemand := float64(localcluster.OnDemandPrice) * hours
		t.Logf("status.cost: $%.6f for %s worker-hours (on demand $%.6f); the nodes' ledgers: $%.6f for %.6f worker-hours (on demand $%.6f)",
			got, c.WorkerHours, onDemand, want, hours, wantOnDemand)
		if want <= 0 || math.Abs(got-want) > 0.01*want {
			t.Errorf("status.cost.cost = $%.6f, the nodes' ledgers say $%.6f: more than 1%% apart", got, want)
		}
		if math.Abs(onDemand-wantOnDemand) > 0.01*wantOnDemand {
			t.Errorf("status.cost.onDemandCost = $%.6f, the ledgers' hours on demand are $%.6f: more than 1%% apart", onDemand, wantOnDemand)
		}
	}
	if out := must("cost", "digits-cli"); !strings.Contains(out, "the controller's bill") {
		t.Errorf("etjob cost does not print the controller's bill:\n%s", out)
	}
	must("delete", "digits-cli")
}

// ledgerCost is what the process nodes' billing ledgers
// (processnode.LedgerFile) say the pods named prefix* in namespace cost, and
// their hours: each pod's start to its last container's end (or to when its
// node was killed with it), times its node's price.
func ledgerCost(t *testing.T, dir, namespace, prefix string) (cost, hours float64) {
	t.Helper()
	ledgers, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", processnode.LedgerFile))
	for _, f := range ledgers {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var killed int64
		if k, err := os.ReadFile(filepath.Join(filepath.Dir(f), localcluster.LedgerStopFile)); err == nil {
			killed, _ = strconv.ParseInt(strings.TrimSpace(string(k)), 10, 64)
		}
		start, end, price := map[string]int64{}, map[string]int64{}, map[string]float64{}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			fs := strings.Fields(line)
			if len(fs) < 4 || !strings.HasPrefix(fs[2], namespace+"/"+prefix) {
				continue
			}
			at, _ := strconv.ParseInt(fs[3], 10, 64)
			switch fs[0] {
			case "start":
				start[fs[1]] = at
				if len(fs) > 4 {
					price[fs[1]], _ = strconv.ParseFloat(fs[4], 64)
				}
			case "end":
				end[fs[1]] = max(end[fs[1]], at)
			}
		}
		for uid, s := range start {
			e, ok := end[uid]
			if !ok && killed > 0 {
				e = killed
			}
			if e > s {
				h := float64(e-s) / float64(time.Hour)
				cost += h * price[uid]
				hours += h
			}
		}
	}
	return cost, hours
}
