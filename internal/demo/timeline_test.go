package demo

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/etjob/etjob/internal/driver"
	"github.com/etjob/etjob/internal/localcluster"
)

// TestWriteTimeline draws a run's logs and the story's reclamations into
// <dir>/timeline.png and says where.
func TestWriteTimeline(t *testing.T) {
	dir := t.TempDir()
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	s := &story{Options: Options{Cluster: &localcluster.Cluster{Dir: dir}, Job: "digits", Out: &out}, start: start, res: &Result{
		Timeline: []string{"   0.0s  submitted ElasticJob default/digits", "  42.5s  reclaiming spot-3 with a 30s notice", "  90.0s  the job completed"},
	}}
	t0 := float64(start.Unix())
	lines := []driver.LogLine{
		{Pod: "digits-worker-0", Kind: "resume", Step: 0, World: 2, T: t0 + 5},
		{Pod: "digits-worker-0", Kind: "step", Step: 1, World: 2, T: t0 + 6},
		{Pod: "digits-worker-0", Kind: "stop", Step: 1, T: t0 + 45},
		{Pod: "digits-worker-0", Kind: "resume", Step: 1, World: 1, T: t0 + 60},
		{Pod: "digits-worker-0", Kind: "step", Step: 2, World: 1, T: t0 + 61},
		{Pod: "digits-worker-0", Kind: "final", Step: 2, T: t0 + 90},
	}
	tl := s.runTimeline(lines, start.Add(time.Hour))
	if len(tl.Events) != 5 || tl.Events[1].Type != "Notice" || !tl.Events[1].At.Equal(start.Add(42500*time.Millisecond)) {
		t.Errorf("events = %+v, want the notice at +42.5s among the training's", tl.Events)
	}
	s.writeTimeline(lines)
	path := filepath.Join(dir, "timeline.png")
	if !strings.Contains(out.String(), "timeline: "+path) {
		t.Errorf("the demo did not say where the timeline is: %q", out.String())
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("%s: %v", path, err)
	}
}
