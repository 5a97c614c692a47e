package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func auditLine(stage, verb, user, uri, objectRef string, code int) string {
	ref := ""
	if objectRef != "" {
		ref = `,"objectRef":` + objectRef
	}
	return fmt.Sprintf(`{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":%q,"requestURI":%q,"verb":%q,`+
		`"user":{"username":%q,"groups":["system:masters"]}%s,"responseStatus":{"metadata":{},"code":%d},`+
		`"requestReceivedTimestamp":"2026-11-29T13:20:10.473703Z","stageTimestamp":"2026-11-29T13:20:10.475931Z"}`,
		stage, uri, verb, user, ref, code)
}

func TestParseAuditLine(t *testing.T) {
	at := time.Date(2026, 11, 29, 13, 20, 10, 473703000, time.UTC)
	podRef := `{"resource":"pods","namespace":"bench","name":"job-0000-worker-8","apiVersion":"v1"}`
	cases := map[string]struct {
		line   string
		want   request
		wantOK bool
	}{
		"a pod create": {
			line:   auditLine("ResponseComplete", "create", controllerUser, "/api/v1/namespaces/bench/pods", podRef, 201),
			want:   request{Verb: "create", Resource: "pods", Namespace: "bench", Name: "job-0000-worker-8", Code: 201, At: at},
			wantOK: true,
		},
		"a status update names the group and subresource": {
			line: auditLine("ResponseComplete", "update", controllerUser, "/apis/etjob.dev/v1alpha1/namespaces/bench/elasticjobs/job-0000/status",
				`{"resource":"elasticjobs","namespace":"bench","name":"job-0000","apiGroup":"etjob.dev","apiVersion":"v1alpha1","subresource":"status"}`, 200),
			want:   request{Verb: "update", Group: "etjob.dev", Resource: "elasticjobs", Subresource: "status", Namespace: "bench", Name: "job-0000", Code: 200, At: at},
			wantOK: true,
		},
		"a watch-list counts when it starts": {
			line:   auditLine("ResponseStarted", "watch", controllerUser, "/api/v1/pods?allowWatchBookmarks=true&sendInitialEvents=true&watch=true", `{"resource":"pods","apiVersion":"v1"}`, 200),
			want:   request{Verb: "watch", Resource: "pods", Code: 200, At: at, InitialEvents: true},
			wantOK: true,
		},
		"a watch does not count again when it ends": {
			line: auditLine("ResponseComplete", "watch", controllerUser, "/api/v1/pods?watch=true", `{"resource":"pods","apiVersion":"v1"}`, 200),
		},
		"another user": {
			line: auditLine("ResponseComplete", "update", "kwok", "/api/v1/namespaces/bench/pods/p/status", podRef, 200),
		},
		"discovery is no resource": {
			line: auditLine("ResponseComplete", "get", controllerUser, "/apis", "", 200),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok, err := parseAuditLine([]byte(tc.line), controllerUser)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got); ok && diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
		})
	}
	if _, _, err := parseAuditLine([]byte("{not json"), controllerUser); err == nil {
		t.Error("a broken line parsed")
	}
}

func TestSummarize(t *testing.T) {
	rs := []request{
		{Verb: "create", Resource: "pods"},
		{Verb: "create", Resource: "pods"},
		{Verb: "update", Resource: "configmaps"},
		{Verb: "update", Group: "etjob.dev", Resource: "elasticjobs", Subresource: "status"},
		{Verb: "create", Group: "events.k8s.io", Resource: "events"},
		{Verb: "patch", Resource: "events"},
		{Verb: "get", Resource: "pods"},
		{Verb: "list", Resource: "nodes"},
		{Verb: "watch", Resource: "pods", InitialEvents: true},
	}
	want := summary{Writes: 4, EventWrites: 2, Gets: 1, Lists: 1, Watches: 1,
		ByKind: tally{"create pods": 2, "update configmaps": 1, "update elasticjobs.etjob.dev/status": 1},
		Reads:  tally{"list nodes": 1, "watch-list pods": 1},
	}
	if diff := cmp.Diff(want, summarize(rs)); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
}

func TestRelists(t *testing.T) {
	cases := map[string]struct {
		rs   []request
		want int
	}{
		"an informer's LIST then WATCH": {
			rs: []request{{Verb: "list", Resource: "pods", Code: 200}, {Verb: "watch", Resource: "pods", Code: 200}},
		},
		"a watch-list, then a plain rewatch from a resourceVersion": {
			rs: []request{{Verb: "watch", Resource: "pods", InitialEvents: true, Code: 200}, {Verb: "watch", Resource: "pods", Code: 200}},
		},
		"a LIST after the informer started": {
			rs:   []request{{Verb: "list", Resource: "pods", Code: 200}, {Verb: "watch", Resource: "pods", Code: 200}, {Verb: "list", Resource: "pods", Code: 200}},
			want: 1,
		},
		"a second watch-list (the watch broke for good)": {
			rs:   []request{{Verb: "watch", Resource: "pods", InitialEvents: true, Code: 200}, {Verb: "watch", Resource: "pods", InitialEvents: true, Code: 200}},
			want: 1,
		},
		"a watch-list refused while the watch cache initializes, then the first one": {
			rs: []request{{Verb: "watch", Resource: "scaleins", InitialEvents: true, Code: 429}, {Verb: "watch", Resource: "scaleins", InitialEvents: true, Code: 200}},
		},
		"a refused LIST after the first one still counts": {
			rs:   []request{{Verb: "list", Resource: "pods", Code: 200}, {Verb: "list", Resource: "pods", Code: 429}},
			want: 1,
		},
		"scopes differ by resource and namespace": {
			rs: []request{
				{Verb: "list", Resource: "pods", Code: 200}, {Verb: "list", Resource: "pods", Namespace: "a", Code: 200},
				{Verb: "list", Resource: "configmaps", Code: 200}, {Verb: "list", Resource: "pods", Subresource: "status", Code: 200},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := relists(tc.rs); len(got) != tc.want {
				t.Errorf("relists = %v, want %d", got, tc.want)
			}
		})
	}
}

func TestJSONDiff(t *testing.T) {
	a := map[string]any{"replicas": 2.0, "workers": []any{map[string]any{"name": "w-0", "node": ""}}, "same": "x"}
	b := map[string]any{"replicas": 3.0, "workers": []any{map[string]any{"name": "w-0", "node": "n-1"}, map[string]any{"name": "w-1"}}, "same": "x"}
	var got []string
	jsonDiff("", a, b, &got)
	want := []string{`replicas: 2 → 3`, `workers[0].node: "" → "n-1"`, `workers[1]: ∅ → {"name":"w-1"}`}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("diff (-want +got):\n%s", diff)
	}
}
