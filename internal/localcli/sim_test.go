package localcli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/etjob/etjob/internal/cli"
)

func runSim(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := NewRootCommand(cli.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append([]string{"sim"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

func tinyTrace(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.csv")
	trace := "0,add,n1\n0,add,n2\n0,add,n3\n600000,remove,n2\n900000,add,n4\n3600000,remove,n1\n"
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSimFlagErrors(t *testing.T) {
	tr := tinyTrace(t)
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no trace":        {nil, "--trace is required"},
		"missing file":    {[]string{"--trace", filepath.Join(t.TempDir(), "nope.csv")}, "nope.csv: no such file"},
		"format":          {[]string{"--trace", tr, "--format", "xml"}, `--format "xml"`},
		"provider":        {[]string{"--trace", tr, "--provider", "ibm"}, `--provider "ibm"`},
		"cheap provider":  {[]string{"--trace", tr, "--cheap-provider", "ibm"}, `--cheap-provider "ibm"`},
		"min above":       {[]string{"--trace", tr, "--min", "40"}, "--min 40"},
		"min zero":        {[]string{"--trace", tr, "--min", "0"}, "--min 0"},
		"replicas":        {[]string{"--trace", tr, "--replicas", "0"}, "--replicas 0"},
		"time scale":      {[]string{"--trace", tr, "--time-scale", "0"}, "--time-scale 0"},
		"negative notice": {[]string{"--trace", tr, "--notice", "-1s"}, "--notice -1s"},
		"pause":           {[]string{"--trace", tr, "--pause", "-1s"}, "--pause -1s"},
		"leave grace":     {[]string{"--trace", tr, "--leave-grace", "1500ms"}, "--leave-grace 1.5s"},
		"cheap fraction":  {[]string{"--trace", tr, "--cheap-fraction", "2"}, "--cheap-fraction 2"},
		"sensitivity":     {[]string{"--trace", tr, "--sensitivity", "-5s"}, "--sensitivity -5s"},
		"rate":            {[]string{"--trace", tr, "--rate", "0"}, "--rate 0"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := runSim(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func TestSimBadTraceNamesLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.csv")
	if err := os.WriteFile(path, []byte("0,add,n1\n5,grow,n1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runSim(t, "--trace", path); err == nil || !strings.Contains(err.Error(), "bad.csv line 2") {
		t.Errorf("err = %v, want one naming bad.csv line 2", err)
	}
}

func TestSimTable(t *testing.T) {
	out, err := runSim(t, "--trace", tinyTrace(t), "--replicas", "4", "--min", "2", "--provider", "gcp")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"### tiny.csv", "Job: 4 workers (min 2)", "| etjob | gcp 30s (15s usable) |", "| checkpoint-restart | ignored |",
		"| checkpoint-restart+grow |", "| on-demand | - |", "alibaba 300s notice", "| 46s |", "Goals:", "Replayed 1.0 h of traces in",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestSimJSON(t *testing.T) {
	out, err := runSim(t, "--trace", tinyTrace(t), "--replicas", "4", "--min", "1", "--notice", "0", "--format", "json", "--time-scale", "2")
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		Trace struct {
			Name string `json:"name"`
		} `json:"trace"`
		TimeScale float64 `json:"timeScale"`
		Scenarios []struct {
			Rows []struct {
				Strategy   string  `json:"strategy"`
				Notice     string  `json:"notice"`
				HardLosses int     `json:"hardLosses"`
				Goodput    float64 `json:"goodput"`
			} `json:"rows"`
		} `json:"scenarios"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(got) != 1 || got[0].Trace.Name != "tiny.csv" || got[0].TimeScale != 2 || len(got[0].Scenarios) != 2 {
		t.Fatalf("json: %s", out)
	}
	el := got[0].Scenarios[0].Rows[0]
	if el.Strategy != "etjob" || el.Notice != "aws (no notice)" || el.HardLosses == 0 || el.Goodput <= 0 {
		t.Errorf("etjob row with --notice 0: %+v", el)
	}
}
