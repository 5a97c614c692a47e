package cli

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestGetTimelineGolden prints seed 001's running job with --timeline.
func TestGetTimelineGolden(t *testing.T) {
	f, out, _ := testFactory(objects()...)
	o := GetOptions{Name: "elastic-training", Timeline: true, factory: f, clients: f.clients, Now: func() time.Time { return now }}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := o.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	golden(t, "get_timeline", out.String())
}

func TestGetTimelineRefusesOutput(t *testing.T) {
	for _, o := range []GetOptions{{Timeline: true, Output: "yaml"}, {Timeline: true, Events: true}} {
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--timeline") {
			t.Errorf("Validate(%+v) = %v, want a refusal naming --timeline", o, err)
		}
	}
}
