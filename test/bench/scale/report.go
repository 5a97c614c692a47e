package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// result is everything one run measured; results.json holds it.
type result struct {
	Command string `json:"command"`
	Tree    string `json:"tree"` // the controller's source: git describe --dirty of this tree, or the -controller binary
	Date    string `json:"date"`
	CPUs    int    `json:"cpus"`

	Jobs            int     `json:"jobs"`
	Workers         int     `json:"workers"`
	Min             int     `json:"min"`
	Max             int     `json:"max"`
	Nodes           int     `json:"nodes"`
	PodsPerNode     int     `json:"podsPerNode"`
	Concurrency     int     `json:"concurrency"`
	ControllerQPS   float64 `json:"controllerQPS"` // 0: the controller's default
	ControllerBurst int     `json:"controllerBurst"`

	Startup     summary `json:"startup"`     // requests before the initial sync
	InitialSync tally   `json:"initialSync"` // LISTs and WATCHes of the initial sync, by resource

	Ramp struct {
		Done                 bool    `json:"done"`
		CreateSeconds        float64 `json:"createSeconds"`
		RunningSeconds       float64 `json:"runningSeconds"` // every job's Running condition true
		FullSeconds          float64 `json:"fullSeconds"`    // every job with spec.replicas members
		PerJobFullMedian     float64 `json:"perJobFullMedianSeconds"`
		PerJobFullMax        float64 `json:"perJobFullMaxSeconds"`
		JobsFull             int     `json:"jobsFull"`
		Members              int     `json:"members"`
		ControllerCPUSeconds float64 `json:"controllerCPUSeconds"`
		Reconciles           int     `json:"reconciles"`
		ReconcileMedianMs    float64 `json:"reconcileMedianMs"`
		ReconcileP99Ms       float64 `json:"reconcileP99Ms"`
		Requests             summary `json:"requests"`
		WritesPerJob         float64 `json:"writesPerJob"`
	} `json:"ramp"`

	Idle struct {
		Seconds         float64 `json:"seconds"`
		ControllerCores float64 `json:"controllerCores"`
		RSSMiB          int64   `json:"rssMiB"`
		Requests        summary `json:"requests"`
	} `json:"idle"`

	Scale                  []scaleResult `json:"scale"`
	ScaleReconciles        int           `json:"scaleReconciles"`
	ScaleReconcileMedianMs float64       `json:"scaleReconcileMedianMs"`
	ScaleReconcileP99Ms    float64       `json:"scaleReconcileP99Ms"`

	ListsAfterSync       int       `json:"listsAfterSync"`
	ListsAfterSyncDetail []request `json:"listsAfterSyncDetail,omitempty"`

	Reconciles        int                   `json:"reconciles"`
	ReconcileMedianMs float64               `json:"reconcileMedianMs"`
	ReconcileP99Ms    float64               `json:"reconcileP99Ms"`
	Procs             map[string]procReport `json:"procs"`
	RestClient        map[string]int        `json:"restClientRequestsByMethod"` // the controller's own count
	AuditByMethod     tally                 `json:"auditByMethod"`              // the API server's count

	Pass     bool     `json:"pass"`
	Failures []string `json:"failures,omitempty"`

	rampMark int
}

// scaleResult is one scale-out by k.
type scaleResult struct {
	Mode               string    `json:"mode"`
	K                  int       `json:"k"`
	Job                string    `json:"job"`
	Goal               int       `json:"goal"` // 2k + 3
	Writes             int       `json:"writes"`
	WritesAfterMembers int       `json:"writesAfterMembers"`
	EventWrites        int       `json:"eventWrites"`
	Gets               int       `json:"gets"`
	Lists              int       `json:"lists"`
	ByKind             tally     `json:"byKind"`
	Seconds            float64   `json:"seconds"` // kwok: /scale write → new members in status; one-by-one: last Ready → members
	Requests           []request `json:"writesInOrder"`
	StatusChanges      []string  `json:"statusChanges"` // what each status write changed, in order
	Pass               bool      `json:"pass"`

	start time.Time
}

type procReport struct {
	CPUSeconds float64 `json:"cpuSeconds"`
	RSSMiB     int64   `json:"rssMiB"`
	PeakRSSMiB int64   `json:"peakRSSMiB"`
}

func newResult(o *options, repoRoot string) *result {
	r := &result{
		Command: strings.Join(os.Args, " "), Tree: "git " + gitDescribe(repoRoot), Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(),
		Jobs: o.jobs, Workers: o.workers, Min: o.min, Max: o.max, Nodes: o.nodes, PodsPerNode: o.podsPerNode,
		Concurrency: o.concurrency, ControllerQPS: o.controllerQPS, ControllerBurst: o.controllerBurst,
	}
	if o.etjob != "" {
		r.Tree = "binary " + o.etjob
	}
	return r
}

// judge applies the goals of issue #6.
func (r *result) judge() {
	r.Failures = nil
	if !r.Ramp.Done {
		r.Failures = append(r.Failures, "not every job reached full membership")
	}
	for _, ev := range r.Scale {
		if !ev.Pass {
			r.Failures = append(r.Failures, fmt.Sprintf("scale-out k=%d of %s: %d API writes, goal ≤ 2k+3 = %d", ev.K, ev.Job, ev.Writes, ev.Goal))
		}
	}
	if r.ListsAfterSync > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d LIST calls after the initial sync, goal 0", r.ListsAfterSync))
	}
	r.Ramp.ReconcileMedianMs = nanToZero(r.Ramp.ReconcileMedianMs)
	r.ScaleReconcileMedianMs = nanToZero(r.ScaleReconcileMedianMs)
	r.ReconcileMedianMs = nanToZero(r.ReconcileMedianMs)
	r.Ramp.ReconcileP99Ms, r.ScaleReconcileP99Ms, r.ReconcileP99Ms = nanToZero(r.Ramp.ReconcileP99Ms), nanToZero(r.ScaleReconcileP99Ms), nanToZero(r.ReconcileP99Ms)
	r.Ramp.PerJobFullMedian = nanToZero(r.Ramp.PerJobFullMedian)
	r.Pass = len(r.Failures) == 0 && len(r.Scale) > 0
}

// print writes the report: the tables of docs/benchmarks.md, then every write
// of the first scale event of each k, then the verdict.
func (r *result) print(w io.Writer) {
	r.ReconcileMedianMs = nanToZero(r.ReconcileMedianMs)
	fmt.Fprintf(w, "\n## Controller at scale: %d jobs × %d workers (min %d, max %d), %d kwok nodes, %d CPUs, tree %s\n\n",
		r.Jobs, r.Workers, r.Min, r.Max, r.Nodes, r.CPUs, r.Tree)
	qps := "default (50/100)"
	if r.ControllerQPS > 0 {
		qps = fmt.Sprintf("%g/%d", r.ControllerQPS, r.ControllerBurst)
	}
	fmt.Fprintf(w, "controller: own process, --concurrency %d, client QPS/burst %s\n\n", r.Concurrency, qps)

	fmt.Fprintln(w, "| new workers Ready | k | goal 2k+3 | API writes (Events excluded), each event | verdict | latency to members, median |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, g := range r.groups() {
		verdict := "pass"
		counts, secs := []string{}, []float64{}
		for _, ev := range g {
			counts = append(counts, fmt.Sprint(ev.Writes))
			secs = append(secs, ev.Seconds)
			if !ev.Pass {
				verdict = "**FAIL**"
			}
		}
		what := "/scale write → members"
		if g[0].Mode == modeOneByOne {
			what = "last Ready → members"
		}
		fmt.Fprintf(w, "| %s | %d | %d | %s | %s | %.2f s (%s) |\n", g[0].Mode, g[0].K, g[0].Goal, strings.Join(counts, ", "), verdict, median(secs), what)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| event | writes by verb and resource | after the members were published | Event writes | GETs, LISTs |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, ev := range r.Scale {
		fmt.Fprintf(w, "| %s k=%d %s | %d: %s | %d | %d | %d, %d |\n",
			ev.Mode, ev.K, ev.Job, ev.Writes, ev.ByKind, ev.WritesAfterMembers, ev.EventWrites, ev.Gets, ev.Lists)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| what | value |")
	fmt.Fprintln(w, "|---|---|")
	fmt.Fprintf(w, "| LIST calls after the initial sync (goal 0; watch-lists, which read a whole collection too, count) | %d |\n", r.ListsAfterSync)
	fmt.Fprintf(w, "| LISTs and WATCHes of the initial sync | %s |\n", r.InitialSync)
	if r.Ramp.Done {
		fmt.Fprintf(w, "| all jobs Running (condition) / every job with %d members | %.1f s / %.1f s (jobs created in %.1f s) |\n",
			r.Workers, r.Ramp.RunningSeconds, r.Ramp.FullSeconds, r.Ramp.CreateSeconds)
		fmt.Fprintf(w, "| per job: creation → full membership (status.membership.changeTime, 1 s resolution) | median %.0f s, max %.0f s |\n",
			r.Ramp.PerJobFullMedian, r.Ramp.PerJobFullMax)
	} else {
		fmt.Fprintf(w, "| ramp | **incomplete**: %d of %d jobs full, %d of %d members |\n", r.Ramp.JobsFull, r.Jobs, r.Ramp.Members, r.Jobs*r.Workers)
	}
	fmt.Fprintf(w, "| controller requests during the ramp | %d writes (%.1f per job: %s), %d Event writes, %d GETs, %d LISTs, %d WATCHes (%s) |\n",
		r.Ramp.Requests.Writes, r.Ramp.WritesPerJob, r.Ramp.Requests.ByKind, r.Ramp.Requests.EventWrites, r.Ramp.Requests.Gets,
		r.Ramp.Requests.Lists, r.Ramp.Requests.Watches, r.Ramp.Requests.Reads)
	fmt.Fprintf(w, "| reconcile time, median (controller_runtime_reconcile_time_seconds, interpolated in buckets) | ramp %.1f ms (%d reconciles), scale events %.1f ms (%d), whole run %.1f ms (%d) |\n",
		r.Ramp.ReconcileMedianMs, r.Ramp.Reconciles, r.ScaleReconcileMedianMs, r.ScaleReconciles, r.ReconcileMedianMs, r.Reconciles)
	fmt.Fprintf(w, "| reconcile time, p99 (same histogram) | ramp %.0f ms, scale events %.0f ms, whole run %.0f ms |\n",
		r.Ramp.ReconcileP99Ms, r.ScaleReconcileP99Ms, r.ReconcileP99Ms)
	fmt.Fprintf(w, "| controller CPU | ramp %.1f s; idle %.3f cores (%0.fs window, %d writes, %d requests) |\n",
		r.Ramp.ControllerCPUSeconds, r.Idle.ControllerCores, r.Idle.Seconds, r.Idle.Requests.Writes,
		r.Idle.Requests.Writes+r.Idle.Requests.EventWrites+r.Idle.Requests.Gets+r.Idle.Requests.Lists+r.Idle.Requests.Watches)
	if p, ok := r.Procs["controller"]; ok {
		fmt.Fprintf(w, "| controller RSS | %d MiB at the end, peak %d MiB; %.1f s CPU in all |\n", p.RSSMiB, p.PeakRSSMiB, p.CPUSeconds)
	}
	for _, n := range []string{"kube-apiserver", "etcd", "kube-scheduler", "kwok"} {
		if p, ok := r.Procs[n]; ok {
			fmt.Fprintf(w, "| %s | RSS %d MiB (peak %d), %.0f s CPU |\n", n, p.RSSMiB, p.PeakRSSMiB, p.CPUSeconds)
		}
	}
	fmt.Fprintf(w, "| cross-check: requests by method, audit log vs the controller's rest_client_requests_total | audit %s; client %s |\n",
		r.AuditByMethod, tally(r.RestClient))

	for _, g := range r.groups() {
		ev := g[slices.IndexFunc(g, func(e scaleResult) bool {
			return e.Writes == slices.MaxFunc(g, func(a, b scaleResult) int { return a.Writes - b.Writes }).Writes
		})]
		fmt.Fprintf(w, "\nEvery write of the scale-out k=%d of %s (%s, the most writes of its group; ms after the /scale write; Events are not counted):\n", ev.K, ev.Job, ev.Mode)
		for _, q := range ev.Requests {
			note := ""
			if q.isEvent() {
				note = "  (Event, not counted)"
			}
			fmt.Fprintf(w, "  %+7.0f ms  %s%s\n", float64(q.At.Sub(ev.start))/float64(time.Millisecond), q, note)
		}
		fmt.Fprintln(w, "What each status write changed, in order (from the benchmark's informer on jobs):")
		for i, sc := range ev.StatusChanges {
			fmt.Fprintf(w, "  %d. %s\n", i+1, sc)
		}
	}
	if r.ListsAfterSync > 0 {
		fmt.Fprintln(w, "\nLIST calls after the initial sync:")
		for _, q := range r.ListsAfterSyncDetail {
			fmt.Fprintf(w, "  %s  %s\n", q.At.Format(time.RFC3339Nano), q)
		}
	}
	fmt.Fprintln(w)
	if r.Pass {
		fmt.Fprintln(w, "PASS: every goal of issue #6 met")
	} else {
		fmt.Fprintln(w, "FAIL:")
		for _, f := range r.Failures {
			fmt.Fprintln(w, "  -", f)
		}
		if len(r.Scale) == 0 {
			fmt.Fprintln(w, "  - no scale event measured")
		}
	}
}

// groups returns the scale events by mode and k, in the order they ran.
func (r *result) groups() [][]scaleResult {
	var out [][]scaleResult
	for _, ev := range r.Scale {
		if n := len(out); n > 0 && out[n-1][0].Mode == ev.Mode && out[n-1][0].K == ev.K {
			out[n-1] = append(out[n-1], ev)
			continue
		}
		out = append(out, []scaleResult{ev})
	}
	return out
}
