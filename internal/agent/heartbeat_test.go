package agent

import (
	"net/url"
	"testing"
	"time"
)

// TestBeats checks when a pod's heartbeat annotation is due: its first beat
// at once, an advancing step at most every HeartbeatInterval, a new world or
// round at most every HeartbeatMinInterval, a step that stays never (its
// since grows old: the controller's stuck rule), and a restarted agent
// keeps the since of the annotation it finds.
func TestBeats(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	s := &beats{}
	if !s.observe("ns/p", beat{step: 1, world: 4, round: 2}, at(0), "") {
		t.Fatal("a first beat is due at once")
	}
	if a, ok := s.take("ns/p", at(0)); !ok || a.Step != 1 || a.World != 4 || a.Round != 2 || a.Since != "2026-12-05T10:00:00Z" || a.RoundSince != a.Since {
		t.Fatalf("take = %+v %v", a, ok)
	}
	if s.observe("ns/p", beat{step: 9, world: 4, round: 2}, at(10*time.Second), "") {
		t.Error("an advancing step is due only HeartbeatInterval after the last write")
	}
	if !s.observe("ns/p", beat{step: 12, world: 4, round: 2}, at(HeartbeatInterval), "") {
		t.Error("an advancing step is due HeartbeatInterval after the last write")
	}
	if a, _ := s.take("ns/p", at(HeartbeatInterval)); a.Step != 12 || a.Since != "2026-12-05T10:00:30Z" || a.RoundSince != "2026-12-05T10:00:00Z" {
		t.Errorf("take = %+v, want step 12 since 10:00:30 in the round since 10:00:00", a)
	}
	if s.observe("ns/p", beat{step: 13, world: 3, round: 3}, at(HeartbeatInterval+time.Second), "") {
		t.Error("a new round is due only HeartbeatMinInterval after the last write")
	}
	if !s.observe("ns/p", beat{step: 13, world: 3, round: 3}, at(HeartbeatInterval+HeartbeatMinInterval), "") {
		t.Error("a new round is due HeartbeatMinInterval after the last write, also when seen before")
	}
	s.take("ns/p", at(HeartbeatInterval+HeartbeatMinInterval))
	for d := 40 * time.Second; d < 10*time.Minute; d += time.Second {
		if s.observe("ns/p", beat{step: 13, world: 3, round: 3}, at(d), "") {
			t.Fatalf("a step that stays is written again at %s", d)
		}
	}
	// a restarted agent: the annotation it finds keeps its since
	r := &beats{}
	if r.observe("ns/p", beat{step: 13, world: 3, round: 3}, at(time.Hour), `{"step":13,"world":3,"round":3,"since":"2026-12-05T10:00:35Z","roundSince":"2026-12-05T10:00:35Z"}`) {
		t.Error("a restarted agent wrote an unchanged heartbeat (its since would move)")
	}
	if _, ok := parseBeat(url.Values{"step": {"x"}, "world": {"1"}, "round": {"1"}}); ok {
		t.Error("a malformed beat was taken")
	}
	if _, ok := parseBeat(url.Values{}); ok {
		t.Error("a poll without a beat was taken as one")
	}
}
