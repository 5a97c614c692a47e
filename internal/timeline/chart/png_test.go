package chart

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/timeline"
)

// story is a small spot story: 4 members, a notice, a leave, a suspend and
// a resume, with the ranks' training steps.
func story() timeline.Timeline {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	return timeline.Timeline{
		Job: "digits", Start: t0, End: at(60),
		Members: []timeline.Point{{At: at(0), Value: 4}, {At: at(20), Value: 3}, {At: at(40), Value: 0}, {At: at(50), Value: 4}},
		World:   []timeline.Point{{At: at(1), Value: 4}, {At: at(21), Value: 3}, {At: at(40), Value: 0}, {At: at(51), Value: 4}},
		Steps:   []timeline.Point{{At: at(1), Value: 10}, {At: at(20), Value: 400}, {At: at(40), Value: 700}, {At: at(60), Value: 900}},
		Events: []timeline.Event{
			{At: at(19), Type: etjobv1.TimelineNotice, Members: -1, Message: "spot-2 reclaimed"},
			{At: at(20), Type: etjobv1.TimelineLeave, Members: 3},
			{At: at(40), Type: etjobv1.TimelineSuspend, Members: 0},
			{At: at(50), Type: etjobv1.TimelineResume, Members: 4},
		},
	}
}

func TestPNG(t *testing.T) {
	statusOnly := story()
	statusOnly.World, statusOnly.Steps = nil, nil
	for name, tl := range map[string]timeline.Timeline{"with training": story(), "status only": statusOnly, "empty": {Job: "j"}} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WritePNG(&buf, tl, 800, 500); err != nil {
				t.Fatal(err)
			}
			img, err := png.Decode(&buf)
			if err != nil {
				t.Fatalf("the PNG does not decode: %v", err)
			}
			if b := img.Bounds(); b.Dx() != 800 || b.Dy() != 500 {
				t.Errorf("size %dx%d, want 800x500", b.Dx(), b.Dy())
			}
		})
	}
	if err := WritePNG(&bytes.Buffer{}, story(), 99, 500); err == nil {
		t.Error("a 99 pixels wide image: no error")
	}
	path := filepath.Join(t.TempDir(), "timeline.png")
	if err := SavePNG(path, story()); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil || cfg.Width != PNGWidth || cfg.Height != PNGHeight {
		t.Errorf("%s: %dx%d, %v; want %dx%d", path, cfg.Width, cfg.Height, err, PNGWidth, PNGHeight)
	}
}
