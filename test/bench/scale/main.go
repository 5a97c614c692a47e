// Command scale is the controller scale benchmark of issue #6: the etjob
// controller, as its own process (cmd/etjob-controller), against the
// real kube-apiserver and etcd (envtest, binaries from
// hack/build-controlplane.sh), the real kube-scheduler, and kwok nodes that
// make scheduled pods Running and Ready without processes (kwok from
// hack/install-kwok.sh).
//
// It counts the controller's API requests from the API server's audit log
// (Metadata level, the controller's user only), which sees every request that
// reached the server, by verb, resource, subresource and name. It gates on
// the goals of issue #6 and exits 1 when one is missed:
//
//   - API writes per scale event (Events excluded) ≤ 2k + 3: a running job's
//     spec.replicas grows by k through /scale; the count runs until the new
//     workers are members (status.membership) and the controller wrote
//     nothing more for -settle. Each k runs in two modes: the new workers
//     become Ready as kwok makes them (often several at once), or one at a
//     time, as on real nodes whose containers start seconds apart;
//   - LIST calls after the initial sync = 0: every full read of a collection
//     (a LIST, or a watch-list with sendInitialEvents) once all jobs run, and
//     every second full read of the same resource before.
//
// It also reports the time to bring every job to full membership, medians of
// controller-runtime's reconcile time, scale-out latency, the controller's
// CPU and RSS from /proc, and, for the costliest scale event of each kind,
// every write in order with what each status write changed.
//
// Usage (make bench-scale runs the defaults; docs/benchmarks.md has results):
//
//	go run ./test/bench/scale [-jobs 100] [-workers 32] [-k 1,2,8] [-repeat 3]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/go-logr/logr"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/scheme"
	"github.com/etjob/etjob/internal/testutil"
)

// namespace holds every benchmark job.
const namespace = "bench"

type options struct {
	jobs, workers, min, max int
	nodes, podsPerNode      int
	ks                      []int
	modes                   []string
	repeat                  int
	concurrency             int
	controllerQPS           float64
	controllerBurst         int
	controllerArgs          []string
	schedulerQPS            int
	apiInflight             int
	idle, settle, rampLimit time.Duration
	dir, etjob, jsonOut     string
	keep                    bool
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.IntVar(&o.jobs, "jobs", 100, "ElasticJobs to run")
	fs.IntVar(&o.workers, "workers", 32, "spec.replicas of each job")
	fs.IntVar(&o.min, "min", 0, "spec.minReplicas (default workers/2)")
	fs.IntVar(&o.max, "max", 0, "spec.maxReplicas (default workers*3/2, at least workers + the largest k)")
	fs.IntVar(&o.nodes, "nodes", 0, "kwok nodes (default: enough for every pod at -pods-per-node)")
	fs.IntVar(&o.podsPerNode, "pods-per-node", 110, "pods each kwok node holds (the kubelet's default maxPods)")
	ks := fs.String("k", "1,2,8", "scale-out sizes to measure, comma-separated")
	fs.IntVar(&o.repeat, "repeat", 3, "scale events per k and mode, each on a different job")
	modes := fs.String("modes", modeKwok+","+modeOneByOne, "how the new workers become Ready: "+modeKwok+" (kwok, as soon as bound), "+modeOneByOne+" (each on its own, after the controller published the previous one)")
	fs.IntVar(&o.concurrency, "concurrency", 4, "controller --concurrency (its default)")
	fs.Float64Var(&o.controllerQPS, "controller-qps", 0, "controller --kube-api-qps (0: the controller's default, 50)")
	fs.IntVar(&o.controllerBurst, "controller-burst", 0, "controller --kube-api-burst (with -controller-qps; default 2×qps)")
	fs.IntVar(&o.schedulerQPS, "scheduler-qps", 500, "kube-scheduler client QPS (burst 2×)")
	fs.IntVar(&o.apiInflight, "api-inflight", 800, "kube-apiserver --max-requests-inflight (mutating: half)")
	fs.DurationVar(&o.idle, "idle", 20*time.Second, "steady-state window after the ramp (CPU, requests of an idle controller)")
	fs.DurationVar(&o.settle, "settle", 3*time.Second, "a scale event ends when the controller wrote nothing for this long; one-by-one workers become Ready after such a pause")
	fs.DurationVar(&o.rampLimit, "ramp-timeout", 30*time.Minute, "give up bringing every job to full membership after this long")
	fs.StringVar(&o.dir, "dir", "", "work directory: logs, audit.log, results.json (default: a temporary one, removed after a passing run)")
	fs.StringVar(&o.etjob, "controller", "", "etjob-controller binary (default: go build ./cmd/etjob-controller from this tree)")
	ctlArgs := fs.String("controller-args", "", "extra etjob-controller flags, space-separated (e.g. --memory-limit=512Mi, as the chart passes its limit)")
	fs.StringVar(&o.jsonOut, "json", "", "also write the results as JSON here")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory after a passing run")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.controllerArgs = strings.Fields(*ctlArgs)
	for f := range strings.SplitSeq(*ks, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k < 1 {
			return nil, fmt.Errorf("-k: %q is not a positive integer", f)
		}
		o.ks = append(o.ks, k)
	}
	for m := range strings.SplitSeq(*modes, ",") {
		if m != modeKwok && m != modeOneByOne {
			return nil, fmt.Errorf("-modes: unknown mode %q (%s, %s)", m, modeKwok, modeOneByOne)
		}
		o.modes = append(o.modes, m)
	}
	if o.jobs < 1 || o.workers < 1 || o.repeat < 1 || o.podsPerNode < 1 {
		return nil, errors.New("-jobs, -workers, -repeat and -pods-per-node must be positive")
	}
	if o.min == 0 {
		o.min = max(1, o.workers/2)
	}
	if o.max == 0 {
		o.max = max(o.workers*3/2, o.workers+slices.Max(o.ks))
	}
	if o.workers+slices.Max(o.ks) > o.max || o.min > o.workers {
		return nil, fmt.Errorf("need -min ≤ -workers and -workers + largest k ≤ -max (%d ≤ %d, %d + %d ≤ %d)", o.min, o.workers, o.workers, slices.Max(o.ks), o.max)
	}
	if events := len(o.ks) * o.repeat * len(o.modes); events > o.jobs {
		return nil, fmt.Errorf("%d scale events need as many jobs; -jobs is %d", events, o.jobs)
	}
	if o.controllerQPS > 0 && o.controllerBurst == 0 {
		o.controllerBurst = int(2 * o.controllerQPS)
	}
	if o.nodes == 0 {
		pods := o.jobs * (o.workers + 1) // + the launcher
		for _, k := range o.ks {
			pods += k * o.repeat
		}
		o.nodes = (pods+o.podsPerNode-1)/o.podsPerNode + 1
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// The benchmark's own clients log nothing worth reading; the
	// controller's log is in its own file.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, o)
	stop()
	os.Exit(code)
}

// run returns the exit code: 0 when every goal is met, 1 when one is missed
// or the run did not finish.
func run(ctx context.Context, o *options) int {
	tmp := o.dir == ""
	if tmp {
		d, err := os.MkdirTemp("", "etjob-bench-scale-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		o.dir = d
	} else if err := os.MkdirAll(o.dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	res, err := bench(ctx, o)
	if res != nil {
		if err != nil {
			res.judge()
			res.Failures, res.Pass = append(res.Failures, "stopped early: "+err.Error()), false
		}
		res.print(os.Stdout)
		b, _ := json.MarshalIndent(res, "", "  ")
		_ = os.WriteFile(filepath.Join(o.dir, "results.json"), b, 0o644)
		if o.jsonOut != "" {
			_ = os.WriteFile(o.jsonOut, b, 0o644)
		}
	}
	pass := err == nil && res != nil && res.Pass
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
	}
	if tmp && pass && !o.keep {
		_ = os.RemoveAll(o.dir)
	} else {
		fmt.Printf("\nwork directory (logs, audit.log, results.json): %s\n", o.dir)
	}
	if !pass {
		return 1
	}
	return 0
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[bench-scale %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// bench runs the whole benchmark. It returns what it measured so far even
// when it stops early.
func bench(ctx context.Context, o *options) (*result, error) {
	repoRoot, err := testutil.RepoRoot()
	if err != nil {
		return nil, err
	}
	res := newResult(o, repoRoot)
	logf("control plane binaries (hack/build-controlplane.sh), kwok (hack/install-kwok.sh)")
	assets, err := testutil.ControlPlaneAssets()
	if err != nil {
		return nil, err
	}
	kwokDir, err := installKwok(repoRoot)
	if err != nil {
		return nil, err
	}
	etjob := o.etjob
	if etjob == "" {
		logf("go build ./cmd/etjob-controller")
		if etjob, err = buildController(repoRoot, o.dir); err != nil {
			return nil, err
		}
	}

	logf("kube-apiserver + etcd (envtest, free ports), audit log %s", filepath.Join(o.dir, "audit.log"))
	c, err := startControlPlane(o, repoRoot, assets)
	if err != nil {
		return nil, err
	}
	defer c.stop()
	if err := c.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return nil, err
	}
	logf("%d kwok nodes × %d pods, kwok, kube-scheduler", o.nodes, o.podsPerNode)
	if err := c.createNodes(ctx, o.nodes, o.podsPerNode); err != nil {
		return nil, err
	}
	if err := c.startKwok(kwokDir); err != nil {
		return nil, err
	}
	if err := c.waitNodesReady(ctx, o.nodes, 2*time.Minute); err != nil {
		return nil, err
	}
	if err := c.startScheduler(assets, o.schedulerQPS); err != nil {
		return nil, err
	}

	logf("etjob controller (%s)", etjob)
	if err := c.startController(o, etjob); err != nil {
		return nil, err
	}
	defer collectProcs(c, res) // before c.stop: also after a failure
	syncMark, err := waitInitialSync(ctx, c)
	if err != nil {
		return res, err
	}
	res.Startup = summarize(c.audit.between(0, syncMark))
	jobs, err := startJobCache(ctx, c)
	if err != nil {
		return res, err
	}

	if err := ramp(ctx, o, c, jobs, res); err != nil {
		return res, err
	}
	if err := idle(ctx, o, c, res); err != nil {
		return res, err
	}
	if err := scaleEvents(ctx, o, c, res); err != nil {
		return res, err
	}
	return res, finish(c, syncMark, res)
}

// waitInitialSync waits until the controller watches ElasticJobs, pods,
// ConfigMaps and nodes and every other resource it tried to read, each with
// a watch the API server accepted, then one second more; it returns the
// audit mark there.
func waitInitialSync(ctx context.Context, c *cluster) (int, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rs, err := c.audit.since(0)
		if err != nil {
			return 0, err
		}
		watched := map[string]bool{"elasticjobs.etjob.dev": false, "pods": false, "configmaps": false, "nodes": false}
		for _, r := range rs {
			if r.Verb == "watch" || r.Verb == "list" {
				watched[r.kind()] = watched[r.kind()] || (r.Verb == "watch" && r.ok())
			}
		}
		missing := []string{}
		for k, ok := range watched {
			if !ok {
				missing = append(missing, k)
			}
		}
		if len(missing) == 0 {
			time.Sleep(time.Second)
			return c.audit.mark()
		}
		if err := c.alive(); err != nil {
			return 0, err
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the controller does not watch %v after 2m; see %s", missing, filepath.Join(c.dir, "controller.log"))
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// startJobCache starts this benchmark's own informer on ElasticJobs (as the
// admin user, so the audit log ignores it), so that following 1,000 jobs
// costs a watch, not repeated LISTs.
func startJobCache(ctx context.Context, c *cluster) (cache.Cache, error) {
	jc, err := cache.New(c.cfg, cache.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, err
	}
	go func() { _ = jc.Start(ctx) }()
	inf, err := jc.GetInformer(ctx, &etjobv1.ElasticJob{})
	if err != nil {
		return nil, err
	}
	if _, err := inf.AddEventHandler(c.tracer.handler()); err != nil {
		return nil, err
	}
	if !jc.WaitForCacheSync(ctx) {
		return nil, errors.New("the benchmark's ElasticJob cache did not sync")
	}
	return jc, nil
}

func jobName(i int) string { return fmt.Sprintf("job-%04d", i) }

// full: every one of the job's spec.replicas workers is a published member.
func full(j *etjobv1.ElasticJob) bool {
	return meta.IsStatusConditionTrue(j.Status.Conditions, etjobv1.ConditionRunning) &&
		len(j.Status.Membership.Hosts) == int(j.Spec.Replicas)
}

// ramp creates every job at once and waits until all have full membership.
func ramp(ctx context.Context, o *options, c *cluster, jobs cache.Cache, res *result) error {
	before, err := scrape(c.metricsURL)
	if err != nil {
		return err
	}
	cpu0, err := readProc(c.controllerPID)
	if err != nil {
		return err
	}
	mark, err := c.audit.mark()
	if err != nil {
		return err
	}
	logf("ramp: creating %d jobs × %d workers (min %d, max %d)", o.jobs, o.workers, o.min, o.max)
	start := time.Now()
	if err := createJobs(ctx, c, o); err != nil {
		return err
	}
	res.Ramp.CreateSeconds = time.Since(start).Seconds()
	lastLog := time.Now()
	for {
		var list etjobv1.ElasticJobList
		if err := jobs.List(ctx, &list, client.InNamespace(namespace)); err != nil {
			return err
		}
		running, nfull, members := 0, 0, 0
		for i := range list.Items {
			j := &list.Items[i]
			members += len(j.Status.Membership.Hosts)
			if meta.IsStatusConditionTrue(j.Status.Conditions, etjobv1.ConditionRunning) {
				running++
			}
			if full(j) {
				nfull++
			}
		}
		el := time.Since(start)
		if running == o.jobs && res.Ramp.RunningSeconds == 0 {
			res.Ramp.RunningSeconds = el.Seconds()
		}
		res.Ramp.JobsFull, res.Ramp.Members = nfull, members
		if nfull == o.jobs {
			res.Ramp.FullSeconds = el.Seconds()
			res.Ramp.Done = true
			perJob := []float64{}
			for i := range list.Items {
				j := &list.Items[i]
				if ct := j.Status.Membership.ChangeTime; ct != nil {
					perJob = append(perJob, ct.Sub(j.CreationTimestamp.Time).Seconds())
				}
			}
			res.Ramp.PerJobFullMedian = median(perJob)
			res.Ramp.PerJobFullMax = slices.Max(perJob)
			logf("ramp: all %d jobs have %d members after %.1fs", o.jobs, o.workers, el.Seconds())
			break
		}
		if time.Since(lastLog) >= 10*time.Second {
			s, _ := readProc(c.controllerPID)
			logf("ramp %4.0fs: jobs Running %d/%d, full %d/%d, members %d/%d; controller CPU %.1fs RSS %d MiB",
				el.Seconds(), running, o.jobs, nfull, o.jobs, members, o.jobs*o.workers, s.CPU.Seconds(), s.RSS>>20)
			lastLog = time.Now()
		}
		if err := c.alive(); err != nil {
			return err
		}
		if el > o.rampLimit {
			return fmt.Errorf("ramp: after %s only %d of %d jobs have full membership (%d of %d members)", o.rampLimit, nfull, o.jobs, members, o.jobs*o.workers)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	cpu1, err := readProc(c.controllerPID)
	if err != nil {
		return err
	}
	res.Ramp.ControllerCPUSeconds = (cpu1.CPU - cpu0.CPU).Seconds()
	if _, err := c.audit.waitQuiet(3*time.Second, 2*time.Minute); err != nil {
		return err
	}
	after, err := scrape(c.metricsURL)
	if err != nil {
		return err
	}
	h := after.Reconcile.minus(before.Reconcile)
	res.Ramp.Reconciles, res.Ramp.ReconcileMedianMs, res.Ramp.ReconcileP99Ms = int(h.count()), 1000*h.quantile(0.5), 1000*h.quantile(0.99)
	end, err := c.audit.mark()
	if err != nil {
		return err
	}
	res.rampMark = end
	res.Ramp.Requests = summarize(c.audit.between(mark, end))
	res.Ramp.WritesPerJob = float64(res.Ramp.Requests.Writes) / float64(o.jobs)
	return nil
}

func createJobs(ctx context.Context, c *cluster, o *options) error {
	held := map[int]bool{}
	for _, ev := range eventPlan(o) {
		held[ev.job] = ev.mode == modeOneByOne
	}
	errs := make(chan error, o.jobs)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range o.jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			j := testutil.MakeElasticJob(jobName(i), namespace).Replicas(int32(o.workers)).Min(int32(o.min)).Max(int32(o.max)).Obj()
			j.UID, j.Generation = "", 0
			if held[i] {
				ct := &j.Spec.WorkerTemplate.Spec.Containers[0]
				ct.Env = append(ct.Env, corev1.EnvVar{Name: holdEnv, Value: strconv.Itoa(o.workers)})
			}
			if err := c.admin.Create(ctx, j); err != nil {
				errs <- fmt.Errorf("creating job %s: %w", j.Name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs // the first error, or nil
}

// idle measures the controller with every job running and nothing changing.
func idle(ctx context.Context, o *options, c *cluster, res *result) error {
	logf("idle: %s with every job running", o.idle)
	cpu0, err := readProc(c.controllerPID)
	if err != nil {
		return err
	}
	mark, err := c.audit.mark()
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(o.idle):
	}
	cpu1, err := readProc(c.controllerPID)
	if err != nil {
		return err
	}
	rs, err := c.audit.since(mark)
	if err != nil {
		return err
	}
	res.Idle.Seconds = o.idle.Seconds()
	res.Idle.ControllerCores = (cpu1.CPU - cpu0.CPU).Seconds() / o.idle.Seconds()
	res.Idle.Requests = summarize(rs)
	res.Idle.RSSMiB = cpu1.RSS >> 20
	return nil
}

// finish collects the LISTs after the initial sync, process samples and the
// cross-check of the audit log against the controller's own metrics, and
// decides pass or fail.
func finish(c *cluster, syncMark int, res *result) error {
	all, err := c.audit.since(0)
	if err != nil {
		return err
	}
	lists := relists(all[:res.rampMark])
	for _, r := range all[res.rampMark:] {
		if r.fullRead() {
			lists = append(lists, r)
		}
	}
	res.ListsAfterSync = len(lists)
	res.ListsAfterSyncDetail = lists
	res.InitialSync = tally{}
	for _, r := range all[:syncMark] {
		if r.Verb == "list" || r.Verb == "watch" {
			res.InitialSync[r.verbKind()]++
		}
	}
	res.AuditByMethod = tally{}
	for _, r := range all {
		res.AuditByMethod[httpMethod(r.Verb)]++
	}
	res.judge()
	return nil
}

// collectProcs samples CPU and memory of every process of the run, and the
// controller's metrics for the whole run.
func collectProcs(c *cluster, res *result) {
	res.Procs = map[string]procReport{}
	pids := childPIDs()
	for _, p := range c.procs {
		pids[p.name] = p.cmd.Process.Pid
	}
	for name, pid := range pids {
		if name != "kube-apiserver" && name != "etcd" && name != "kwok" && name != "kube-scheduler" && name != "controller" {
			continue
		}
		if s, err := readProc(pid); err == nil {
			res.Procs[name] = procReport{CPUSeconds: s.CPU.Seconds(), RSSMiB: s.RSS >> 20, PeakRSSMiB: s.HWM >> 20}
		}
	}
	if m, err := scrape(c.metricsURL); err == nil {
		res.RestClient = m.Requests
		res.ReconcileMedianMs, res.Reconciles = nanToZero(1000*m.Reconcile.quantile(0.5)), int(m.Reconcile.count())
		res.ReconcileP99Ms = nanToZero(1000 * m.Reconcile.quantile(0.99))
	}
}

// httpMethod maps an audit verb to the HTTP method of the request.
func httpMethod(verb string) string {
	switch verb {
	case "create":
		return "POST"
	case "update":
		return "PUT"
	case "patch":
		return "PATCH"
	case "delete", "deletecollection":
		return "DELETE"
	}
	return "GET"
}

// gitDescribe names the tree the controller was built from.
func gitDescribe(repoRoot string) string {
	out, err := exec.Command("git", "-C", repoRoot, "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// nanToZero keeps NaN (no observations) out of JSON.
func nanToZero(f float64) float64 {
	if math.IsNaN(f) {
		return 0
	}
	return f
}
