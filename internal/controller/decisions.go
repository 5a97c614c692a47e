package controller

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/etjob/etjob/internal/core"
)

// DecisionRecord is one call of core.Decide as the controller made it: what
// it observed, when, what the core planned, and whether applying the plan
// failed. `etjob-local chaos --replay` runs Decide again on every record and
// checks the plan is the same and the invariants hold (issue #6).
type DecisionRecord struct {
	Snapshot core.Snapshot `json:"snapshot"`
	Now      time.Time     `json:"now"`
	Plan     core.Plan     `json:"plan"`
	// ApplyError is the error of applying the plan ("" when every deletion,
	// signal and creation went through).
	ApplyError string `json:"applyError,omitempty"`
}

// DecisionRecorder appends DecisionRecords as JSON lines to a file. One
// write per record on a file opened for appending, so records of a
// controller that is killed or restarted stay whole.
type DecisionRecorder struct {
	mu sync.Mutex
	f  *os.File
}

// NewDecisionRecorder opens (or creates) path for appending.
func NewDecisionRecorder(path string) (*DecisionRecorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--record-decisions: %w", err)
	}
	return &DecisionRecorder{f: f}, nil
}

// Record appends one decision. The snapshot carries no managed fields (the
// cache strips them, ManagerOptions). A record that cannot be written is
// dropped: recording must never stop the controller.
func (d *DecisionRecorder) Record(snap core.Snapshot, now time.Time, plan core.Plan, applyErr error) {
	if d == nil {
		return
	}
	rec := DecisionRecord{Snapshot: snap, Now: now, Plan: plan}
	if applyErr != nil {
		rec.ApplyError = applyErr.Error()
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, _ = d.f.Write(append(b, '\n'))
}
