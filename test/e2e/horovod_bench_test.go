package e2e

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHorovodBench measures real Horovod on the local cluster, the way
// `etjob-local demo --churn` measures torchrun (docs/benchmarks.md): for each of
// ETJOB_HVD_BENCH cycles, a noticed loss (20 s notice), a hard loss (no
// notice) and the two replacements' joins, each read off rank 0's step
// lines: the pause (last step before to first step after) and the steps
// done again. It is skipped unless ETJOB_HVD_BENCH is set (make
// bench-horovod).
func TestHorovodBench(t *testing.T) {
	cycles, _ := strconv.Atoi(os.Getenv("ETJOB_HVD_BENCH"))
	if cycles <= 0 {
		t.Skip("ETJOB_HVD_BENCH is not set (make bench-horovod)")
	}
	requireHorovod(t)
	ctx := withTimeout(t, time.Duration(cycles)*4*time.Minute+5*time.Minute)
	e := startHorovodCluster(t, ctx, "etjob-e2e-hvd-bench", 3)
	logs := followLaunchers(t, ctx, e, "bench")
	e.cli(t, "submit", "etjob", "--spot-instance", "--name=bench", "--gpus=1", "--workers=3", "--min-workers=2", "--max-workers=3",
		"--image=horovod:local", fmt.Sprintf(seed000Command, 5000))
	waitFor(t, ctx, "training on 3 ranks", 4*time.Minute, func() (bool, string) {
		r := parseHorovodLog(logs.text())
		return r.lastStep() > 50 && lastWorld(logs.text()) == 3, tail(logs.text(), 20)
	})
	type event struct {
		class  string // noticed loss, hard loss or join
		pause  float64
		redone int
	}
	var events []event
	// settle waits for the first reset after since (any world size when
	// to is 0) and for training to go on 20 steps past it, and records it.
	settle := func(class, kind string, since time.Time, to int) transition {
		var got transition
		waitFor(t, ctx, kind, 3*time.Minute, func() (bool, string) {
			for _, tr := range parseHorovodLog(logs.text()).transitionsAfter(since) {
				if to == 0 || tr.toWorld == to {
					got = tr
					return true, ""
				}
			}
			return false, tail(logs.text(), 20)
		})
		waitFor(t, ctx, kind+": training goes on", 2*time.Minute, func() (bool, string) {
			return parseHorovodLog(logs.text()).lastStep() > got.after.step+20, tail(logs.text(), 20)
		})
		events = append(events, event{class, got.pause(), got.redone()})
		t.Logf("%s: world %d -> %d after step %d: pause %.2f s, %d steps done again", kind, got.fromWorld, got.toWorld, got.before.step, got.pause(), got.redone())
		return got
	}
	pick := func() string {
		ws := liveWorkers(t, ctx, e, "bench")
		n, _ := workerNode(t, ctx, e, ws[len(ws)-1])
		return n
	}
	for i := range cycles {
		// A noticed loss. The spare node is there already: the replacement
		// is created when the leaver's pod goes (at its node's deadline, as
		// maxReplicas counts it until then), so it joins in a reset of its
		// own.
		if _, err := e.AddNode(ctx, "", true); err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		reclaimAsync(t, ctx, e, pick(), 20*time.Second)
		if tr := settle("noticed loss", fmt.Sprintf("cycle %d: noticed loss", i+1), at, 0); tr.toWorld < 3 {
			settle("join", fmt.Sprintf("cycle %d: join after the noticed loss", i+1), tr.after.at, 3)
		}
		// A hard loss, with no spare node until Horovod went on without it.
		at = time.Now()
		if err := e.Reclaim(ctx, pick(), 0); err != nil {
			t.Fatal(err)
		}
		tr := settle("hard loss", fmt.Sprintf("cycle %d: hard loss", i+1), at, 0)
		if _, err := e.AddNode(ctx, "", true); err != nil {
			t.Fatal(err)
		}
		if tr.toWorld < 3 {
			settle("join", fmt.Sprintf("cycle %d: join after the hard loss", i+1), tr.after.at, 3)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| event | n | pause p50 | pause max | steps done again (total, max) |\n|---|---|---|---|---|\n")
	for _, kind := range []string{"noticed loss", "hard loss", "join"} {
		var pauses []float64
		total, worst := 0, 0
		for _, ev := range events {
			if ev.class == kind {
				pauses = append(pauses, ev.pause)
				total += ev.redone
				worst = max(worst, ev.redone)
			}
		}
		slices.Sort(pauses)
		if len(pauses) == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %.2f s | %.2f s | %d, %d |\n", kind, len(pauses), pauses[(len(pauses)-1)/2], pauses[len(pauses)-1], total, worst)
	}
	t.Logf("Horovod on the local cluster, %d cycles:\n%s", cycles, b.String())
	if out := os.Getenv("ETJOB_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	e.cli(t, "delete", "bench")
}
