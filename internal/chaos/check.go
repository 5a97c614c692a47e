package chaos

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/etjob/etjob/internal/driver"
	"github.com/etjob/etjob/internal/localcluster"
)

// check judges the run from the training logs and checkpoints, the job's
// status, the cluster and the decision record. runErr is what stopped the
// run, if anything: the checks still say what they can.
func (r *runner) check(runErr error) {
	res := r.res
	if res.Job == nil {
		if j, err := r.d.Get(context.Background()); err == nil {
			res.Job, res.GenerationEnd = j, j.Status.Membership.Generation
		}
	}
	add := func(name string, ok bool, format string, args ...any) {
		res.Checks = append(res.Checks, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	add("schedule ran to the end", runErr == nil, "%d faults recorded%s", len(res.Faults), errSuffix(runErr))

	counts := r.counts()
	var kinds []string
	for _, k := range []string{KindNotice, KindHard, KindBurst, KindBurstBelowMin, KindReconfLoss, KindCancel,
		KindRestartController, KindRestartAgent, KindRestartAPIServer, KindAPIServerDownScaleOut, KindLauncherLost,
		KindAddNode, KindDrought} {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, counts[k]))
	}
	missing := []string{}
	for _, s := range res.Schedule {
		if counts[s.Kind] == 0 && !slices.Contains(missing, s.Kind) {
			missing = append(missing, s.Kind)
		}
	}
	add("every fault kind injected", len(missing) == 0 && counts[KindAddNode] > 0, "%s; missing %v", strings.Join(kinds, ", "), missing)

	noticed := map[string]int{}
	for _, f := range res.Faults {
		if f.Notice != "" && f.Notice != "0s" && f.Kind != KindCancel {
			for _, p := range f.Providers {
				noticed[p]++
			}
		}
	}
	all := true
	for _, p := range localcluster.Providers {
		all = all && noticed[p] > 0
	}
	add("noticed reclaims from all four clouds", all, "%v", noticed)

	lines, err := r.d.Logs()
	if err != nil {
		add("training logs", false, "%v", err)
	}
	acc, steps, completed := driver.Final(lines)
	res.Accuracy, res.Steps, res.Resumes = acc, steps, driver.Resumes(lines)
	add("training completed", completed, "%d steps", steps)
	ledgerOK, detail := driver.LedgerOK(lines)
	add("sampler ledger: every sample once per epoch", ledgerOK, "%s", detail)

	var stopLost, hardLost []int
	stopOK, hardOK := true, true
	for _, rs := range res.Resumes {
		if rs.AfterStop {
			stopLost = append(stopLost, rs.Lost)
			stopOK = stopOK && rs.Lost == 0
		} else {
			hardLost = append(hardLost, rs.Lost)
			hardOK = hardOK && rs.Lost <= CheckpointEvery
		}
	}
	add("0 committed steps lost after every agreed stop (noticed events, joins)", stopOK && len(stopLost) > 0, "%d restarts, lost %v", len(stopLost), stopLost)
	add(fmt.Sprintf("restarts without a stop (hard losses) lose <= %d steps", CheckpointEvery), hardOK, "%d restarts, lost %v", len(hardLost), hardLost)

	changes := res.GenerationEnd - res.GenerationStart
	add(fmt.Sprintf("membership changes >= %d", MinMembershipChanges), changes >= MinMembershipChanges,
		"generation %d -> %d: %d changes; %d members' nodes taken", res.GenerationStart, res.GenerationEnd, changes, r.losses())

	add("burst below min: the job suspended and resumed", r.suspended, "Suspended/WaitingForCapacity seen=%t", r.suspended)
	add("withdrawn notice: the node survived, its notice cleared", r.cancelledOK, "%s", r.cancelledNote)
	reconf := false
	for _, f := range res.Faults {
		if f.BeforeResume != nil {
			reconf = *f.BeforeResume
		}
	}
	add("loss during a reconfiguration fired before training resumed", reconf, "beforeResume=%t", reconf)

	if res.Job != nil {
		st := res.Job.Status
		add("failures == 0 (preemptions are no failures)", st.Failures == 0, "failures %d, preemptions %d, restarts %d", st.Failures, st.Preemptions, st.Restarts)
	} else {
		add("failures == 0 (preemptions are no failures)", false, "the job's final status was not read")
	}
	r.mu.Lock()
	baseline := res.BaselineAccuracy
	r.mu.Unlock()
	if baseline > 0 {
		add("accuracy within 1 point of the undisturbed run", math.Abs(acc-baseline) <= 0.01, "%.4f vs %.4f undisturbed (%d processes, same epochs)", acc, baseline, desiredWorkers)
	} else if r.Baseline {
		add("accuracy within 1 point of the undisturbed run", false, "no undisturbed accuracy")
	}
	if runErr == nil {
		orphans := r.orphans(context.Background())
		add("0 orphaned pods after the job is deleted", orphans == 0, "%d pods", orphans)
		left := r.leftovers()
		add("0 training processes left after the job is deleted", len(left) == 0, "%d left %v", len(left), left)
	}

	{
		rep, err := ReplayFile(r.DecisionsPath)
		res.Replay = rep
		if err != nil {
			add("decision replay: every plan identical", false, "%v", err)
		} else {
			add("decision replay: every plan identical", rep.MismatchCount == 0 && rep.Decisions > 0, "%d decisions, %d differ %v", rep.Decisions, rep.MismatchCount, first(rep.Mismatches))
			add("invariants: generation monotonic, Running within [min,max], no name created twice", rep.ViolationCount == 0,
				"%d violations %v; generation %d -> %d", rep.ViolationCount, first(rep.Violations), rep.FirstGeneration, rep.LastGeneration)
		}
	}
}

func (r *runner) counts() map[string]int {
	out := map[string]int{}
	for _, f := range r.res.Faults {
		out[f.Kind]++
	}
	return out
}

// losses counts the members' nodes the faults took.
func (r *runner) losses() int {
	n := 0
	for _, f := range r.res.Faults {
		if takesMembers(f.Kind) {
			n += len(f.Nodes)
		}
	}
	return n
}

func first(s []string) []string {
	if len(s) > 3 {
		return s[:3]
	}
	return s
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}

// Summary prints the run as a table.
func (r *Result) Summary(w io.Writer) {
	fmt.Fprintf(w, "\n=== etjob-local chaos, seed %d ===\n", r.Seed)
	counts := map[string]int{}
	for _, f := range r.Faults {
		counts[f.Kind]++
	}
	var kinds []string
	for k := range counts {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	fmt.Fprint(w, "faults:")
	for _, k := range kinds {
		fmt.Fprintf(w, " %s=%d", k, counts[k])
	}
	fmt.Fprintf(w, " (total %d)\n", len(r.Faults))
	fmt.Fprintf(w, "membership generation %d -> %d (%d changes); training restarts %d; steps %d; wall %s\n",
		r.GenerationStart, r.GenerationEnd, r.GenerationEnd-r.GenerationStart, len(r.Resumes), r.Steps, r.Wall.Round(time.Second))
	if r.Replay != nil {
		r.Replay.Summary(w)
	}
	width := 0
	for _, c := range r.Checks {
		width = max(width, len(c.Name))
	}
	fmt.Fprintf(w, "%-*s  %-4s  %s\n", width, "check", "", "detail")
	for _, c := range r.Checks {
		v := "ok"
		if !c.OK {
			v = "FAIL"
		}
		fmt.Fprintf(w, "%-*s  %-4s  %s\n", width, c.Name, v, c.Detail)
	}
	if r.OK() {
		fmt.Fprintln(w, "all checks passed")
	} else {
		fmt.Fprintln(w, "SOME CHECKS FAILED")
	}
}
