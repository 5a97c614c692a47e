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

func TestParseTaints(t *testing.T) {
	got, err := ParseTaints("CriticalAddonsOnly=true:NoSchedule, dedicated:NoExecute")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Key != "CriticalAddonsOnly" || got[0].Value != "true" || got[0].Effect != "NoSchedule" ||
		got[1].Key != "dedicated" || got[1].Value != "" || got[1].Effect != "NoExecute" {
		t.Errorf("ParseTaints = %+v", got)
	}
	for _, bad := range []string{"novalue", "k=v:Sometimes", "=v:NoSchedule"} {
		if _, err := ParseTaints(bad); err == nil {
			t.Errorf("ParseTaints(%q) = nil error, want one", bad)
		}
	}
}
