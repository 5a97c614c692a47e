package e2e

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/driver"
)

// faultModes are the worker commands `make bench-faults` runs side by side
// on the same schedule.
var faultModes = map[string]string{
	"inprocess":      "python3 /opt/etjob/examples/digits/train_elastic.py",
	"etjob-torchrun": "python3 -m etjob.torchrun /opt/etjob/examples/digits/train.py",
	"stock-torchrun": "python3 /opt/etjob/hack/stock-torchrun.py /opt/etjob/examples/digits/train.py",
}

// TestFaultsBench is `make bench-faults` (issue #15): for each mode of
// ETJOB_FAULTS_MODES, a job of 4 workers (min 2) trains the digits example
// on the local cluster while, every 30 s, a member's node is killed without
// notice and then a node is added (the controller's replacement joins), for
// ETJOB_FAULTS_BENCH minutes. ETJOB_FAULTS_NOTICE (a duration, e.g. 20s)
// gives each loss that notice instead: the noticed losses of issue #15's
// goal. From the per-rank step logs (when each step was
// first logged): the share of the wall time training was paused by the
// faults (the longest gap between steps after each event, until the next),
// the share of all gaps longer than four times the median step (which also
// counts the machine's own hiccups: slow checkpoint writes, a busy core), the
// pause of each kill and join, the steps done again, and for the in-process
// mode whether any pod's process changed.
func TestFaultsBench(t *testing.T) {
	minutes, _ := strconv.ParseFloat(os.Getenv("ETJOB_FAULTS_BENCH"), 64)
	if minutes <= 0 {
		t.Skip("ETJOB_FAULTS_BENCH is not set (make bench-faults)")
	}
	modes := strings.Split(os.Getenv("ETJOB_FAULTS_MODES"), ",")
	if modes[0] == "" {
		modes = []string{"inprocess", "etjob-torchrun", "stock-torchrun"}
	}
	every := 30 * time.Second
	if s := os.Getenv("ETJOB_FAULTS_EVERY"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("ETJOB_FAULTS_EVERY=%q: %v", s, err)
		}
		every = d
	}
	var notice time.Duration
	if s := os.Getenv("ETJOB_FAULTS_NOTICE"); s != "" && s != "0" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("ETJOB_FAULTS_NOTICE=%q: %v", s, err)
		}
		notice = d
	}
	var report []string
	for _, mode := range modes {
		command, ok := faultModes[mode]
		if !ok {
			t.Fatalf("ETJOB_FAULTS_MODES: no mode %q (inprocess, etjob-torchrun, stock-torchrun)", mode)
		}
		t.Run(mode, func(t *testing.T) {
			report = append(report, faultsRun(t, mode, command, time.Duration(minutes*float64(time.Minute)), every, notice))
		})
	}
	t.Logf("\n| mode | wall s | paused by the faults (each event's longest gap) | paused, all gaps > 4 × the median step | losses (kill or notice): pause p50 / max s (events) | joins: pause p50 / max s (events) | steps done again: max | pids changed |\n|---|---|---|---|---|---|---|---|\n%s",
		strings.Join(report, "\n"))
}

func faultsRun(t *testing.T, mode, command string, length, every, notice time.Duration) string {
	ctx := withTimeout(t, length+15*time.Minute)
	e := startCluster(t, ctx, "etjob-e2e-faults", 4, 1)
	repo, dir := e.repo, e.Dir
	ckpt := e.sharedDir(t, "ckpt")
	run := func(bin string, args ...string) {
		t.Helper()
		e.run(t, ctx, bin, args...)
	}
	logs := func() []driver.LogLine {
		lines, err := driver.ReadLogs(dir, "default", "faults")
		if err != nil {
			t.Fatal(err)
		}
		return lines
	}
	run(e.bin, "submit", "etjob", "--name=faults", "--workers=4", "--min-workers=2", "--max-workers=4", "--gpus=1",
		"--spot-instance", "--image=etjob/digits:local", "--data-dir", repo+":/opt/etjob", "--data-dir", ckpt+":/ckpt",
		"--checkpoint-dir=/ckpt", "-e", "PATH=/usr/bin:/bin", "-e", "PYTHONPATH=/opt/etjob/python", "-e", "EPOCHS=100000",
		command)
	waitFor(t, ctx, "training with 4 ranks", 4*time.Minute, func() (bool, string) {
		for _, l := range logs() {
			if l.Kind == "step" && l.World == 4 {
				return true, ""
			}
		}
		return false, "no step at world 4"
	})
	type event struct {
		kind string
		at   time.Time
	}
	var events []event
	began := time.Now()
	time.Sleep(every)
	for kill := true; time.Since(began) < length; kill = !kill {
		if kill {
			node := ""
			j := e.job(t, ctx, "faults")
			var nodes []string
			for _, w := range j.Status.Workers {
				if w.State == etjobv1.WorkerMember && w.Node != "" {
					nodes = append(nodes, w.Node)
				}
			}
			sort.Strings(nodes)
			if len(nodes) > 2 {
				node = nodes[len(events)/2%len(nodes)]
			}
			if node == "" {
				t.Logf("%s: %d members only, no kill this time", time.Since(began).Round(time.Second), len(nodes))
			} else {
				if notice > 0 {
					// The reclaim returns at the deadline: the schedule
					// goes on meanwhile.
					events = append(events, event{"notice", time.Now()})
					reclaimAsync(t, ctx, e, node, notice)
				} else {
					events = append(events, event{"kill", time.Now()})
					run(e.local, "cluster", "reclaim", node, "--notice", "0")
				}
			}
		} else {
			events = append(events, event{"join", time.Now()})
			run(e.local, "cluster", "add-node", "--spot")
		}
		time.Sleep(every)
	}
	ended := time.Now()
	lines := logs()
	run(e.bin, "delete", "faults")

	// When each step was first logged: the pace of training, and its pauses.
	first := map[int]float64{}
	pids := map[string]map[int]bool{}
	for _, l := range lines {
		if l.Kind != "step" {
			continue
		}
		if v, ok := first[l.Step]; !ok || l.T < v {
			first[l.Step] = l.T
		}
		if pids[l.Pod] == nil {
			pids[l.Pod] = map[int]bool{}
		}
		pids[l.Pod][l.Pid] = true
	}
	from, to := float64(began.UnixNano())/1e9, float64(ended.UnixNano())/1e9
	var times []float64
	for _, v := range first {
		if v >= from && v <= to {
			times = append(times, v)
		}
	}
	sort.Float64s(times)
	if len(times) < 10 {
		t.Fatalf("%d steps in the window", len(times))
	}
	gaps := make([]float64, 0, len(times))
	for i := 1; i < len(times); i++ {
		gaps = append(gaps, times[i]-times[i-1])
	}
	sorted := slices.Clone(gaps)
	sort.Float64s(sorted)
	step := sorted[len(sorted)/2]
	paused := 0.0
	for _, g := range gaps {
		if g > 4*step {
			paused += g
		}
	}
	type gap struct{ at, d float64 }
	var long []gap
	for i, g := range gaps {
		if g > 4*step {
			long = append(long, gap{times[i] - from, g})
		}
	}
	sort.Slice(long, func(a, b int) bool { return long[a].d > long[b].d })
	var show []string
	for _, g := range long[:min(len(long), 12)] {
		show = append(show, fmt.Sprintf("%.2f s at %.0f s", g.d, g.at))
	}
	t.Logf("%s: median step %.3f s, %d steps, %d pauses over %.2f s: %s", mode, step, len(times), len(long), 4*step, strings.Join(show, ", "))
	// Each event's pause: the longest gap between steps until the next event.
	pauses := map[string][]float64{}
	for i, ev := range events {
		a := float64(ev.at.UnixNano()) / 1e9
		b := to
		if i+1 < len(events) {
			b = float64(events[i+1].at.UnixNano()) / 1e9
		}
		longest := 0.0
		for k := 1; k < len(times); k++ {
			if times[k] > a && times[k-1] < b {
				longest = max(longest, times[k]-max(times[k-1], a))
			}
		}
		pauses[ev.kind] = append(pauses[ev.kind], longest)
		t.Logf("%s %s at %.0f s: longest pause %.2f s", mode, ev.kind, a-from, longest)
	}
	again := 0
	for _, r := range driver.Resumes(lines) {
		again = max(again, r.Lost)
	}
	changed := "n/a (torchrun restarts its workers)"
	if mode == "inprocess" {
		n := 0
		for _, set := range pids {
			if len(set) > 1 {
				n++
			}
		}
		changed = fmt.Sprintf("%d of %d pods", n, len(pids))
	}
	stat := func(v []float64) string {
		if len(v) == 0 {
			return "-"
		}
		s := slices.Clone(v)
		sort.Float64s(s)
		return fmt.Sprintf("%.2f / %.2f (%d)", s[len(s)/2], s[len(s)-1], len(s))
	}
	eventPaused := 0.0
	for _, v := range pauses {
		for _, d := range v {
			eventPaused += d
		}
	}
	row := fmt.Sprintf("| %s | %.0f | %.1f %% (%.1f s) | %.1f %% (%.1f s) | %s | %s | %d | %s |", mode, to-from,
		100*eventPaused/(to-from), eventPaused, 100*paused/(to-from), paused,
		stat(append(pauses["kill"], pauses["notice"]...)), stat(pauses["join"]), again, changed)
	t.Log(row)
	return row
}
