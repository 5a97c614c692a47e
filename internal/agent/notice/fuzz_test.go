package notice

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The fuzz targets feed the providers' parsers any bytes a metadata service
// (or something posing as one) could answer with. Properties, for every
// provider: no panic; an error comes with the zero Notice, so a malformed
// answer is never a notice; a notice names its provider and carries a
// deadline only when it is a reclaim; and a deadline, written back in the
// provider's documented format, parses to the same instant. Seeds are the
// documented payloads of testdata/<provider>/ plus testdata/fuzz/FuzzXxx/.
//
//	go test -run '^$' -fuzz '^FuzzAzure$' -fuzztime 60s ./internal/agent/notice

// addFixtures seeds f with every testdata file matching pattern.
func addFixtures(f *testing.F, pattern string) {
	f.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", pattern))
	if err != nil || len(files) == 0 {
		f.Fatalf("no fixtures match testdata/%s: %v", pattern, err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// checkNotice holds the properties every parsed answer has.
func checkNotice(t *testing.T, provider string, n Notice, err error) {
	t.Helper()
	if err != nil {
		if !n.Equal(Notice{}) {
			t.Fatalf("error %v came with a notice %+v: a malformed answer must never be a notice", err, n)
		}
		return
	}
	if n.Source != provider {
		t.Fatalf("Source = %q, want %q", n.Source, provider)
	}
	if n.Kind != Reclaim && !n.Deadline.IsZero() {
		t.Fatalf("a %v notice has a deadline %v", n.Kind, n.Deadline)
	}
	if n.Kind == None && (n.Detail != "" || n.EventID != "") {
		t.Fatalf("no notice, but Detail %q, EventID %q", n.Detail, n.EventID)
	}
	if n.Kind != None && n.Detail == "" {
		t.Fatalf("a %v notice without a Detail", n.Kind)
	}
	if loc := n.Deadline.Location(); loc != time.UTC {
		t.Fatalf("deadline %v is in %v, want UTC", n.Deadline, loc)
	}
}

func FuzzAlibaba(f *testing.F) {
	addFixtures(f, "alibaba/*")
	f.Fuzz(func(t *testing.T, body []byte) {
		n, err := parseAlibabaTermination(body)
		checkNotice(t, ProviderAlibaba, n, err)
		if err != nil {
			return
		}
		if n.Kind != Reclaim {
			t.Fatalf("termination-time %q read as %v, want a reclaim", body, n.Kind)
		}
		again, err := parseAlibabaTermination([]byte(n.Deadline.Format(time.RFC3339Nano)))
		if err != nil || !again.Deadline.Equal(n.Deadline) {
			t.Fatalf("deadline %v does not round-trip: %v, %v", n.Deadline, again.Deadline, err)
		}
	})
}

func FuzzAWSInstanceAction(f *testing.F) {
	addFixtures(f, "aws/instance-action*")
	f.Fuzz(func(t *testing.T, body []byte) {
		n, err := parseAWSInstanceAction(body)
		checkNotice(t, ProviderAWS, n, err)
		if err != nil {
			return
		}
		if n.Kind != Reclaim || !json.Valid(body) {
			t.Fatalf("instance-action %q read as %v (valid JSON: %t), want a reclaim from valid JSON", body, n.Kind, json.Valid(body))
		}
		action := strings.TrimPrefix(n.Detail, "spot instance-action ")
		if !slices.Contains([]string{"terminate", "stop", "hibernate"}, action) {
			t.Fatalf("action %q is none of terminate, stop, hibernate", action)
		}
		doc, _ := json.Marshal(awsInstanceAction{Action: action, Time: n.Deadline.Format(time.RFC3339Nano)})
		again, err := parseAWSInstanceAction(doc)
		if err != nil || !again.Equal(n) {
			t.Fatalf("%s: got %+v, %v; want %+v (the notice does not round-trip)", doc, again, err, n)
		}
	})
}

func FuzzAWSRebalance(f *testing.F) {
	addFixtures(f, "aws/rebalance*")
	f.Fuzz(func(t *testing.T, body []byte) {
		n, err := parseAWSRebalance(body)
		checkNotice(t, ProviderAWS, n, err)
		if err == nil && (n.Kind != EarlyWarning || !json.Valid(body)) {
			t.Fatalf("rebalance %q read as %v (valid JSON: %t), want an early warning from valid JSON", body, n.Kind, json.Valid(body))
		}
	})
}

func FuzzGCP(f *testing.F) {
	for _, preempted := range []string{"preempted-true.txt", "preempted-false.txt", "preempted-malformed.txt"} {
		for _, maintenance := range []string{"maintenance-event-none.txt", "maintenance-event-migrate.txt", "maintenance-event-terminate.txt"} {
			p, err1 := os.ReadFile(filepath.Join("testdata/gcp", preempted))
			m, err2 := os.ReadFile(filepath.Join("testdata/gcp", maintenance))
			if err1 != nil || err2 != nil {
				f.Fatal(err1, err2)
			}
			f.Add(p, m)
		}
	}
	f.Fuzz(func(t *testing.T, preempted, maintenance []byte) {
		p, err := parseGCPPreempted(preempted)
		if v := strings.TrimSpace(string(preempted)); (err == nil) != (v == "TRUE" || v == "FALSE") || p != (v == "TRUE") {
			t.Fatalf("preempted %q read as %t, %v; want TRUE or FALSE only", preempted, p, err)
		}
		n, err := parseGCPMaintenance(maintenance)
		checkNotice(t, ProviderGCP, n, err)
		if err == nil && n.Kind == Reclaim {
			t.Fatalf("maintenance-event %q read as a reclaim: maintenance is only an early warning", maintenance)
		}
		if v := strings.TrimSpace(string(maintenance)); err == nil && (n.Kind == None) != (v == "NONE") {
			t.Fatalf("maintenance-event %q read as %v", maintenance, n.Kind)
		}
	})
}

func FuzzAzure(f *testing.F) {
	files, _ := filepath.Glob("testdata/azure/*")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "myspotvm")
		f.Add(b, "")
	}
	f.Fuzz(func(t *testing.T, body []byte, vm string) {
		n, err := parseAzureEvents(body, vm)
		checkNotice(t, ProviderAzure, n, err)
		if err != nil || n.Kind == None {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("a notice from invalid JSON %q", body)
		}
		// The notice is one of the document's pending events for this VM.
		// Azure documents NotBefore as RFC 1123 in GMT: a deadline read from
		// anything else (another zone, read at the node's offset or as UTC)
		// is a guess, so the reclaim's deadline must be what the documented
		// form says.
		var doc AzureDocument
		_ = json.Unmarshal(body, &doc)
		i := slices.IndexFunc(doc.Events, func(ev AzureEvent) bool {
			switch {
			case n.Detail != ev.EventType+" "+ev.EventID, vm != "" && !slices.Contains(ev.Resources, vm):
				return false
			case ev.EventStatus != "" && ev.EventStatus != "Scheduled" && ev.EventStatus != "Started":
				return false
			case n.Kind != Reclaim:
				return true
			case ev.NotBefore == "":
				return n.Deadline.IsZero()
			}
			want, err := time.Parse(http.TimeFormat, ev.NotBefore)
			return err == nil && want.Equal(n.Deadline)
		})
		if i < 0 {
			t.Fatalf("notice %+v is no pending event of the document for VM %q, with its NotBefore in GMT", n, vm)
		}
		ev := doc.Events[i]
		if ev.NotBefore == "" || n.Kind != Reclaim {
			return
		}
		ev.NotBefore = n.Deadline.Format(http.TimeFormat)
		again, err := json.Marshal(AzureDocument{Events: []AzureEvent{ev}})
		if err != nil {
			t.Fatal(err)
		}
		if m, err := parseAzureEvents(again, vm); err != nil || !m.Equal(n) {
			t.Fatalf("%s: got %+v, %v; want %+v (the deadline does not round-trip)", again, m, err, n)
		}
	})
}
