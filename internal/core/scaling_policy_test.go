package core

import (
	"math"
	"testing"
)

// The scaling policy's choices as functions. Decide's tables
// (scaling_test.go) keep the stories across policies.

func TestScaleInVictims(t *testing.T) {
	ws := []*podView{onNode("w0", "a", 0, false), onNode("w1", "a", 1, false), onNode("w2", "a", 2, false), onNode("w3", "a", 3, false)}
	ws[1].scaleIn = true // named by a ScaleIn request
	for desired, want := range map[int32]string{4: "", 5: "", 3: "w1", 2: "w1, w3", 0: "w1, w3, w2, w0"} {
		if got := names(scaleInVictims(ws, desired)); got != want {
			t.Errorf("desired %d: %q leave, want %q", desired, got, want)
		}
	}
	if ws[0].pod.Name != "w0" || ws[3].pod.Name != "w3" {
		t.Error("scaleInVictims reordered its input")
	}
}

func TestCreateCount(t *testing.T) {
	for _, c := range []struct {
		desired         int32
		base, alive     int
		max, budget     int32
		wantN, wantWant int32
	}{
		{desired: 4, base: 2, alive: 2, max: 8, budget: math.MaxInt32, wantN: 2, wantWant: 2},
		{desired: 4, base: 2, alive: 7, max: 8, budget: math.MaxInt32, wantN: 1, wantWant: 1}, // maxReplicas pods alive
		{desired: 4, base: 2, alive: 2, max: 8, budget: 1, wantN: 1, wantWant: 2},             // the budget buys one
		{desired: 100, base: 0, alive: 0, max: 100, budget: math.MaxInt32, wantN: MaxCreatesPerPass, wantWant: 100},
		{desired: 2, base: 3, alive: 3, max: 8, budget: math.MaxInt32, wantN: -1, wantWant: -1}, // above desired: create none
	} {
		n, want := createCount(c.desired, c.base, c.alive, c.max, c.budget)
		if n != c.wantN || want != c.wantWant {
			t.Errorf("%+v: n %d, want %d; got want %d, want %d", c, n, c.wantN, want, c.wantWant)
		}
	}
}

func TestGivenBack(t *testing.T) {
	unscheduled := onNode("x9", "", 9, true)
	unscheduled.scheduled = false
	extra := []*podView{onNode("x5", "a", 5, true), unscheduled, onNode("x7", "a", 7, true)}
	if got := names(givenBack(extra, 2)); got != "x7, x9" {
		t.Errorf("gave back %q, want the unscheduled one and then the highest index (x7, x9)", got)
	}
	if got := names(extra[:1]); got != "x5" {
		t.Errorf("kept %q, want x5", got)
	}
}
