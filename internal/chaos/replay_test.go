package chaos

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
)

// testdata/decisions.jsonl.gz is a slice of a real run's decision record
// (`etjob-local chaos --seed 1`, <dir>/decisions.jsonl, records 1-13, 15, 22,
// 32, 36 and 41, cut on 2026-12-01 when status.cost joined the plans): the
// job's creation, its first membership, three noticed reclaims with their
// replacements, and the deletion of noticed and replaced workers. A
// deliberate change of what Decide plans for
// these snapshots fails TestReplayRecorded: cut a new slice from a fresh
// run's record (the records named above) and say why in the change.
// 2026-12-07: status.ranks (members × slotsPerWorker, issue #43) was added
// to every recorded status that has members, the plans' and the
// snapshots' (which a controller with the field would have written), by a
// script; nothing else changed.
const recorded = "testdata/decisions.jsonl.gz"

func readRecord(t *testing.T) [][]byte {
	t.Helper()
	f, err := os.Open(recorded)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Split(bytes.TrimSpace(raw), []byte("\n"))
}

func TestReplayRecorded(t *testing.T) {
	lines := readRecord(t)
	rep, err := Replay(bytes.NewReader(bytes.Join(lines, []byte("\n"))))
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		var b strings.Builder
		rep.Summary(&b)
		t.Fatalf("the recorded run does not replay:\n%s", b.String())
	}
	if rep.Decisions != len(lines) || rep.GenerationChanges == 0 || rep.Jobs != 1 {
		t.Errorf("replayed %d of %d decisions of %d jobs with %d generation raises; want all, one job, some raises",
			rep.Decisions, len(lines), rep.Jobs, rep.GenerationChanges)
	}
}

// tamper rewrites one record through f on its JSON object.
func tamper(t *testing.T, line []byte, f func(rec map[string]any)) []byte {
	t.Helper()
	var rec map[string]any
	if err := json.Unmarshal(line, &rec); err != nil {
		t.Fatal(err)
	}
	f(rec)
	out, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func obj(m map[string]any, path ...string) map[string]any {
	for _, p := range path {
		m = m[p].(map[string]any)
	}
	return m
}

func TestReplayFinds(t *testing.T) {
	lines := readRecord(t)
	last := len(lines) - 1
	for name, tc := range map[string]struct {
		edit           func(lines [][]byte) [][]byte
		wantMismatches bool
		wantViolation  string
	}{
		"a plan the core would not make": {
			edit: func(lines [][]byte) [][]byte {
				lines[last] = tamper(t, lines[last], func(rec map[string]any) {
					obj(rec, "plan", "Status")["summary"] = "tampered"
				})
				return lines
			},
			wantMismatches: true,
		},
		"a generation going back": {
			edit: func(lines [][]byte) [][]byte {
				lines[last] = tamper(t, lines[last], func(rec map[string]any) {
					obj(rec, "snapshot", "Job", "status", "membership")["generation"] = -1
				})
				return lines
			},
			wantMismatches: true,
			wantViolation:  "went back",
		},
		"a worker created twice": {
			edit: func(lines [][]byte) [][]byte {
				var rec map[string]any
				for i, l := range lines {
					_ = json.Unmarshal(l, &rec)
					if c, _ := obj(rec, "plan")["CreateWorkers"].([]any); len(c) > 0 {
						return append(lines, lines[i])
					}
				}
				t.Fatal("no record creates a worker")
				return nil
			},
			wantViolation: "created before",
		},
	} {
		t.Run(name, func(t *testing.T) {
			edited := tc.edit(append([][]byte(nil), lines...))
			rep, err := Replay(bytes.NewReader(bytes.Join(edited, []byte("\n"))))
			if err != nil {
				t.Fatal(err)
			}
			if got := rep.MismatchCount > 0; got != tc.wantMismatches {
				t.Errorf("mismatches %d (%v), want some: %t", rep.MismatchCount, rep.Mismatches, tc.wantMismatches)
			}
			if tc.wantViolation != "" && !strings.Contains(strings.Join(rep.Violations, "\n"), tc.wantViolation) {
				t.Errorf("violations %v, want one saying %q", rep.Violations, tc.wantViolation)
			}
			if rep.OK() {
				t.Error("the tampered record replays as OK")
			}
		})
	}
}
