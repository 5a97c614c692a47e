package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/fields"
)

func TestNoticeEventSelector(t *testing.T) {
	sel := NoticeEventSelector()
	for _, c := range []struct {
		kind, reason string
		want         bool
	}{
		{"Pod", "SpotToBeReleased", true}, // ECI
		{"Pod", "Evicted", true},          // ACS BestEffort
		{"Pod", "SomeCloudsOwnReason", true},
		{"Pod", "Scheduled", false},
		{"Pod", "Started", false},
		{"Node", "SpotToBeReleased", false},
	} {
		if got := sel.Matches(fields.Set{"involvedObject.kind": c.kind, "reason": c.reason}); got != c.want {
			t.Errorf("%s/%s: selected %v, want %v (%s)", c.kind, c.reason, got, c.want, sel)
		}
	}
}
