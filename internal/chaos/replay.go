package chaos

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/controller"
	"github.com/etjob/etjob/internal/core"
)

// ReplayFile replays a decision record file (gzip-compressed when its name
// ends in .gz).
func ReplayFile(path string) (*ReplayReport, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		r = zr
	}
	return Replay(r)
}

// ReplayReport is what replaying a decision record found.
type ReplayReport struct {
	// Decisions is the number of records replayed.
	Decisions int
	// Jobs is the number of distinct jobs (UIDs) in the record.
	Jobs int
	// Mismatches are records whose replayed plan differs from the recorded
	// one (the first 20; MismatchCount counts them all).
	Mismatches    []string
	MismatchCount int
	// Violations are broken invariants (the first 20; ViolationCount counts
	// them all).
	Violations     []string
	ViolationCount int
	// FirstGeneration and LastGeneration are the membership generations
	// the record saw (of the last job).
	FirstGeneration, LastGeneration int64
	// GenerationChanges counts the decisions that raised the generation.
	GenerationChanges int
	// Created counts the workers created (plans applied without error).
	Created int
}

// OK says whether every plan replayed identically and no invariant broke.
func (r *ReplayReport) OK() bool { return r.MismatchCount == 0 && r.ViolationCount == 0 }

// maxListed bounds how many mismatches or violations a report keeps.
const maxListed = 20

// jobTrack is what the invariants remember of one job.
type jobTrack struct {
	gen     int64
	created map[string]int // worker name -> line of the record that created it
}

// Replay reads a decision record (controller.DecisionRecord per line), runs
// core.Decide again on every snapshot at its recorded time, and checks that
// the plan is identical and that the invariants hold: the membership
// generation never goes backwards, Running only with minReplicas <= members
// <= maxReplicas, no worker name created twice.
func Replay(r io.Reader) (*ReplayReport, error) {
	rep := &ReplayReport{}
	jobs := map[string]*jobTrack{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		var rec struct {
			controller.DecisionRecord
			Plan json.RawMessage `json:"plan"`
		}
		if err := json.Unmarshal(raw, &rec); err != nil {
			return rep, fmt.Errorf("line %d: %w", line, err)
		}
		if rec.Snapshot.Job == nil {
			return rep, fmt.Errorf("line %d: no snapshot.job", line)
		}
		var recorded core.Plan
		if err := json.Unmarshal(rec.Plan, &recorded); err != nil {
			return rep, fmt.Errorf("line %d: plan: %w", line, err)
		}
		rep.Decisions++
		replayed := core.Decide(rec.Snapshot, rec.Now)
		// Both sides go through the same encoding: the recorded plan was
		// written by json.Marshal, the replayed one is written the same way.
		again, err := json.Marshal(replayed)
		if err != nil {
			return rep, fmt.Errorf("line %d: %w", line, err)
		}
		want, _ := json.Marshal(recorded)
		if !bytes.Equal(again, want) {
			rep.mismatch(fmt.Sprintf("line %d (%s at %s): replayed plan differs: %s", line, rec.Snapshot.Job.Name,
				rec.Now.Format("15:04:05.000"), firstDiff(string(want), string(again))))
		}
		uid := string(rec.Snapshot.Job.UID)
		jt := jobs[uid]
		if jt == nil {
			jt = &jobTrack{gen: rec.Snapshot.Job.Status.Membership.Generation, created: map[string]int{}}
			jobs[uid] = jt
			rep.FirstGeneration = jt.gen
		}
		rep.check(line, rec.Snapshot, recorded, rec.ApplyError, jt)
		rep.LastGeneration = max(rep.LastGeneration, recorded.Status.Membership.Generation)
	}
	rep.Jobs = len(jobs)
	return rep, sc.Err()
}

func (rep *ReplayReport) check(line int, snap core.Snapshot, plan core.Plan, applyErr string, jt *jobTrack) {
	job := snap.Job
	seen := job.Status.Membership.Generation
	planned := plan.Status.Membership.Generation
	if seen < jt.gen {
		rep.violate(fmt.Sprintf("line %d: the job's membership generation went back from %d to %d", line, jt.gen, seen))
	}
	if planned < seen {
		rep.violate(fmt.Sprintf("line %d: the plan lowers the membership generation from %d to %d", line, seen, planned))
	}
	if planned > seen {
		rep.GenerationChanges++
	}
	jt.gen = max(jt.gen, seen)
	if meta.IsStatusConditionTrue(plan.Status.Conditions, etjobv1.ConditionRunning) {
		members := plan.Status.Members
		lo, hi := job.Spec.MinReplicas, job.Spec.MaxReplicas
		if members < lo || (hi > 0 && members > hi) {
			rep.violate(fmt.Sprintf("line %d: Running with %d members outside [%d, %d]", line, members, lo, hi))
		}
		if n := int32(len(plan.Status.Membership.Hosts)); n != members && len(plan.Status.Membership.Hosts) > 0 {
			rep.violate(fmt.Sprintf("line %d: Running with %d members but %d published hosts", line, members, n))
		}
	}
	existing := map[string]bool{}
	for _, p := range snap.Pods {
		existing[p.Name] = true
	}
	for _, i := range plan.CreateWorkers {
		name := core.WorkerName(job.Name, i)
		if existing[name] {
			rep.violate(fmt.Sprintf("line %d: plans to create %s, which exists", line, name))
		}
		if at, ok := jt.created[name]; ok {
			rep.violate(fmt.Sprintf("line %d: plans to create %s, created before (line %d)", line, name, at))
		}
		if applyErr == "" {
			jt.created[name] = line
			rep.Created++
		}
	}
}

func (rep *ReplayReport) mismatch(s string) {
	rep.MismatchCount++
	if len(rep.Mismatches) < maxListed {
		rep.Mismatches = append(rep.Mismatches, s)
	}
}

func (rep *ReplayReport) violate(s string) {
	rep.ViolationCount++
	if len(rep.Violations) < maxListed {
		rep.Violations = append(rep.Violations, s)
	}
}

// firstDiff shows where two encodings first differ, with some context.
func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(0, i-60)
	clip := func(s string) string {
		if i >= len(s) {
			return s[lo:]
		}
		return s[lo:min(len(s), i+60)]
	}
	return fmt.Sprintf("recorded …%s… replayed …%s…", strings.TrimSpace(clip(a)), strings.TrimSpace(clip(b)))
}

// Summary prints the report.
func (r *ReplayReport) Summary(w io.Writer) {
	fmt.Fprintf(w, "replayed %d decisions of %d job(s): %d identical plans, %d differ, %d invariant violations; generation %d -> %d (%d raises); %d workers created\n",
		r.Decisions, r.Jobs, r.Decisions-r.MismatchCount, r.MismatchCount, r.ViolationCount, r.FirstGeneration, r.LastGeneration, r.GenerationChanges, r.Created)
	for _, m := range r.Mismatches {
		fmt.Fprintln(w, "  MISMATCH "+m)
	}
	for _, v := range r.Violations {
		fmt.Fprintln(w, "  VIOLATION "+v)
	}
}
