package processnode

import "testing"

func TestParseLabels(t *testing.T) {
	got, err := ParseLabels("karpenter.sh/capacity-type=spot, etjob.dev/price-per-hour=0.91,empty=")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"karpenter.sh/capacity-type": "spot", "etjob.dev/price-per-hour": "0.91", "empty": ""}
	if len(got) != len(want) {
		t.Fatalf("ParseLabels = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("label %q = %q, want %q", k, got[k], v)
		}
	}
	for _, bad := range []string{"novalue", "bad key=x", "k=bad value"} {
		if _, err := ParseLabels(bad); err == nil {
			t.Errorf("ParseLabels(%q) = nil error, want one", bad)
		}
	}
}
