package chaos

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSchedule(t *testing.T) {
	for _, seed := range []int64{0, 1, 2, 3, 42, 977261} {
		steps := Schedule(seed)
		if diff := cmp.Diff(steps, Schedule(seed)); diff != "" {
			t.Fatalf("seed %d: the schedule is not reproducible (-first +second):\n%s", seed, diff)
		}
		kinds := map[string]int{}
		for _, s := range steps {
			kinds[s.Kind]++
			if s.Gap < 6 || s.Gap > 14 {
				t.Errorf("seed %d: gap %d outside [6, 14]", seed, s.Gap)
			}
			if s.Kind == KindBurst && (s.K < 2 || s.K > 3) {
				t.Errorf("seed %d: burst of %d nodes, want 2 or 3", seed, s.K)
			}
		}
		for _, k := range []string{KindNotice, KindHard, KindBurst, KindBurstBelowMin, KindReconfLoss, KindCancel,
			KindRestartController, KindRestartAgent, KindRestartAPIServer, KindAPIServerDownScaleOut, KindLauncherLost} {
			if kinds[k] == 0 {
				t.Errorf("seed %d: no %s in %s", seed, k, String(steps))
			}
		}
		if steps[0].Kind == KindBurstBelowMin {
			t.Errorf("seed %d: the burst below min comes first", seed)
		}
		// Each member's node taken is a leave and, with capacity back, a
		// join: twice the losses must reach the run's minimum.
		if l := MembershipLosses(steps); 2*l < MinMembershipChanges {
			t.Errorf("seed %d: %d losses cannot make %d membership changes", seed, l, MinMembershipChanges)
		}
	}
	if cmp.Equal(Schedule(1), Schedule(2)) {
		t.Error("seeds 1 and 2 give the same schedule")
	}
}
