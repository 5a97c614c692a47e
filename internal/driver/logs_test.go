package driver

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "worker.log")
	body := "resume step=0 world=2 restart=0 t=10.000\n" +
		"step=1 epoch=0 rank=0 world=2 loss=2.3000 t=10.500\n" +
		"step=2 epoch=0 rank=1 world=3 loss=2.2000 pid=4242 gen=3 t=11.000\n" +
		"resume step=2 world=3 generation=4 t=11.200\n" +
		"etjob.elastic: generation 4 rank 0/3 t=11.2\n" +
		"ledger ok t=12.000\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := parseLog(path, "w-0")
	if err != nil {
		t.Fatal(err)
	}
	want := []LogLine{
		{Pod: "w-0", Kind: "resume", Step: 0, World: 2, T: 10},
		{Pod: "w-0", Kind: "step", Step: 1, Rank: 0, World: 2, T: 10.5},
		{Pod: "w-0", Kind: "step", Step: 2, Rank: 1, World: 3, Pid: 4242, Gen: 3, T: 11},
		{Pod: "w-0", Kind: "resume", Step: 2, World: 3, T: 11.2},
		{Pod: "w-0", Kind: "ledger", Value: "ok", T: 12},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d lines %+v; want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: got %+v; want %+v", i, got[i], want[i])
		}
	}
	if r := Resumes(got); len(r) != 1 || r[0].From != 2 || r[0].Lost != 0 {
		t.Errorf("Resumes = %+v; want one from step 2 losing nothing", r)
	}
}

func TestFinalLoss(t *testing.T) {
	lines := ParseLines("ledger ok t=12.000\nfinal accuracy=0.6055 steps=192 t=12.500\nfinal loss=1.104059\n")
	if loss, ok := FinalLoss(lines); !ok || loss != 1.104059 {
		t.Errorf("FinalLoss = %v, %v; want 1.104059, true (lines %+v)", loss, ok, lines)
	}
	if acc, steps, ok := Final(lines); !ok || acc != 0.6055 || steps != 192 {
		t.Errorf("Final = %v, %d, %v; want 0.6055, 192, true", acc, steps, ok)
	}
	if _, ok := FinalLoss(ParseLines("final accuracy=0.6 steps=1 t=1.0\n")); ok {
		t.Error("FinalLoss found a loss in output without one")
	}
}
