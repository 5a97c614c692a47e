package main

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestQuantile(t *testing.T) {
	inf := math.Inf(1)
	cases := map[string]struct {
		h    histogram
		q    float64
		want float64
	}{
		"inside the first bucket, from 0": {
			h: histogram{Bounds: []float64{0.005, 0.01, inf}, Counts: []float64{4, 4, 4}}, q: 0.5, want: 0.0025,
		},
		"interpolated in the bucket that holds the rank": {
			h: histogram{Bounds: []float64{0.005, 0.01, 0.025, inf}, Counts: []float64{2, 6, 10, 10}}, q: 0.5, want: 0.00875, // 0.005 + 0.005×(5-2)/(6-2)
		},
		"in +Inf: the highest finite bound": {
			h: histogram{Bounds: []float64{0.005, 0.01, inf}, Counts: []float64{0, 1, 10}}, q: 0.5, want: 0.01,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := tc.h.quantile(tc.q); math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("quantile(%g) = %g, want %g", tc.q, got, tc.want)
			}
		})
	}
	if got := (histogram{}).quantile(0.5); !math.IsNaN(got) {
		t.Errorf("empty histogram: %g, want NaN", got)
	}
}

func TestHistogramMinus(t *testing.T) {
	old := histogram{Bounds: []float64{1, math.Inf(1)}, Counts: []float64{1, 2}, Sum: 3}
	now := histogram{Bounds: []float64{1, math.Inf(1)}, Counts: []float64{4, 7}, Sum: 10}
	want := histogram{Bounds: now.Bounds, Counts: []float64{3, 5}, Sum: 7}
	if diff := cmp.Diff(want, now.minus(old)); diff != "" {
		t.Errorf("minus (-want +got):\n%s", diff)
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP controller_runtime_reconcile_time_seconds Length of time per reconciliation per controller
# TYPE controller_runtime_reconcile_time_seconds histogram
controller_runtime_reconcile_time_seconds_bucket{controller="elasticjob",le="0.01"} 3
controller_runtime_reconcile_time_seconds_bucket{controller="elasticjob",le="0.005"} 1
controller_runtime_reconcile_time_seconds_bucket{controller="elasticjob",le="+Inf"} 4
controller_runtime_reconcile_time_seconds_sum{controller="elasticjob"} 0.5
controller_runtime_reconcile_time_seconds_count{controller="elasticjob"} 4
controller_runtime_reconcile_time_seconds_bucket{controller="scaleout",le="0.005"} 9
rest_client_requests_total{code="200",host="127.0.0.1:40000",method="GET"} 7
rest_client_requests_total{code="201",host="127.0.0.1:40000",method="POST"} 5
rest_client_requests_total{code="409",host="127.0.0.1:40000",method="PUT"} 1
rest_client_requests_total{code="200",host="127.0.0.1:40000",method="PUT"} 2
`
	m, err := parseMetrics(strings.NewReader(text), "elasticjob")
	if err != nil {
		t.Fatal(err)
	}
	want := metrics{
		Reconcile: histogram{Bounds: []float64{0.005, 0.01, math.Inf(1)}, Counts: []float64{1, 3, 4}, Sum: 0.5},
		Requests:  map[string]int{"GET": 7, "POST": 5, "PUT": 3},
	}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

func TestParseStatCPU(t *testing.T) {
	// The command name may hold spaces and parentheses.
	stat := "4242 (etjob (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 100 0 0"
	got, err := parseStatCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * time.Second; got != want {
		t.Errorf("cpu = %s, want %s", got, want)
	}
	if _, err := parseStatCPU("4242 (short) S 1"); err == nil {
		t.Error("a short stat line parsed")
	}
}

func TestReadProcSelf(t *testing.T) {
	s, err := readProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.RSS <= 0 || s.HWM < s.RSS {
		t.Errorf("RSS %d, peak %d", s.RSS, s.HWM)
	}
}

func TestHoldReady(t *testing.T) {
	stage := "kind: Stage\nspec:\n  selector:\n    matchExpressions:\n    - key: '.status.phase'\n      operator: 'In'\n      values:\n      - 'Pending'\n"
	got, err := holdReady(stage)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, holdEnv) || !strings.Contains(got, "etjob.dev/worker-index") || !strings.HasSuffix(got, "      - 'Pending'\n") {
		t.Errorf("stage with the hold:\n%s", got)
	}
	if _, err := holdReady("kind: Stage\n"); err == nil {
		t.Error("a stage without a selector was extended")
	}
}
