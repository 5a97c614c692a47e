package notice_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/etjob/etjob/internal/agent/notice"
	"github.com/etjob/etjob/internal/emucloud"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func clock() time.Time { return now }

// fixtureServer serves the given paths from testdata files (or a status) and
// hands out an IMDSv2 token to any PUT /latest/api/token.
type fixtureServer struct {
	t      *testing.T
	routes map[string]string // path -> testdata file, or "status:503"
}

func (f fixtureServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/latest/api/token" {
		fmt.Fprint(w, "fixture-token")
		return
	}
	route, ok := f.routes[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	if code, found := strings.CutPrefix(route, "status:"); found {
		var c int
		fmt.Sscan(code, &c)
		w.WriteHeader(c)
		return
	}
	b, err := os.ReadFile(filepath.Join("testdata", route))
	if err != nil {
		f.t.Errorf("fixture: %v", err)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	_, _ = w.Write(b)
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func source(t *testing.T, provider, base string) notice.Source {
	t.Helper()
	switch provider {
	case notice.ProviderGCP:
		return &notice.GCP{BaseURL: base, Now: clock}
	case notice.ProviderAzure:
		return &notice.Azure{BaseURL: base, VMName: "myspotvm"}
	}
	s, err := notice.New(provider, notice.Options{BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const (
	alibabaPath       = "/latest/meta-data/instance/spot/termination-time"
	awsActionPath     = "/latest/meta-data/spot/instance-action"
	awsRebalance      = "/latest/meta-data/events/recommendations/rebalance"
	gcpPreempted      = "/computeMetadata/v1/instance/preempted"
	gcpMaintenance    = "/computeMetadata/v1/instance/maintenance-event"
	azureEventsPath   = "/metadata/scheduledevents"
	azureInstancePath = "/metadata/instance"
)

// TestFixtures reads each provider's documented payloads.
func TestFixtures(t *testing.T) {
	testCases := map[string]struct {
		provider string
		routes   map[string]string
		want     notice.Notice
		wantErr  string
	}{
		"alibaba termination-time": {
			provider: notice.ProviderAlibaba,
			routes:   map[string]string{alibabaPath: "alibaba/termination-time.txt"},
			want:     notice.Notice{Kind: notice.Reclaim, Deadline: time.Date(2015, 1, 5, 18, 2, 0, 0, time.UTC), Source: "alibaba", Detail: "spot termination-time 2015-01-05T18:02:00Z"},
		},
		"alibaba termination-time without seconds": {
			provider: notice.ProviderAlibaba,
			routes:   map[string]string{alibabaPath: "alibaba/termination-time-no-seconds.txt"},
			want:     notice.Notice{Kind: notice.Reclaim, Deadline: time.Date(2015, 1, 5, 18, 2, 0, 0, time.UTC), Source: "alibaba", Detail: "spot termination-time 2015-01-05T18:02Z"},
		},
		"alibaba none": {
			provider: notice.ProviderAlibaba,
			want:     notice.Notice{Source: "alibaba"},
		},
		"alibaba malformed": {
			provider: notice.ProviderAlibaba,
			routes:   map[string]string{alibabaPath: "alibaba/termination-time-malformed.txt"},
			wantErr:  "alibaba termination-time",
		},
		"alibaba 500": {
			provider: notice.ProviderAlibaba,
			routes:   map[string]string{alibabaPath: "status:500"},
			wantErr:  "unexpected status 500",
		},
		"aws terminate": {
			provider: notice.ProviderAWS,
			routes:   map[string]string{awsActionPath: "aws/instance-action.json"},
			want:     notice.Notice{Kind: notice.Reclaim, Deadline: time.Date(2017, 9, 18, 8, 22, 0, 0, time.UTC), Source: "aws", Detail: "spot instance-action terminate"},
		},
		"aws stop": {
			provider: notice.ProviderAWS,
			routes:   map[string]string{awsActionPath: "aws/instance-action-stop.json"},
			want:     notice.Notice{Kind: notice.Reclaim, Deadline: time.Date(2017, 9, 18, 8, 22, 0, 0, time.UTC), Source: "aws", Detail: "spot instance-action stop"},
		},
		"aws rebalance": {
			provider: notice.ProviderAWS,
			routes:   map[string]string{awsRebalance: "aws/rebalance.json"},
			want:     notice.Notice{Kind: notice.EarlyWarning, Source: "aws", Detail: "rebalance recommendation at 2020-10-27T08:22:00Z"},
		},
		"aws action wins over rebalance": {
			provider: notice.ProviderAWS,
			routes:   map[string]string{awsActionPath: "aws/instance-action.json", awsRebalance: "aws/rebalance.json"},
			want:     notice.Notice{Kind: notice.Reclaim, Deadline: time.Date(2017, 9, 18, 8, 22, 0, 0, time.UTC), Source: "aws", Detail: "spot instance-action terminate"},
		},
		"aws none": {
			provider: notice.ProviderAWS,
			want:     notice.Notice{Source: "aws"},
		},
		"aws malformed": {
			provider: notice.ProviderAWS,
			routes:   map[string]string{awsActionPath: "aws/instance-action-malformed.json"},
			wantErr:  "aws spot/instance-action",
		},
		"aws 503": {
			provider: notice.ProviderAWS,
			routes:   map[string]string{awsActionPath: "status:503"},
			wantErr:  "unexpected status 503",
		},
		"gcp preempted": {
			provider: notice.ProviderGCP,
			routes:   map[string]string{gcpPreempted: "gcp/preempted-true.txt", gcpMaintenance: "gcp/maintenance-event-none.txt"},
			want:     notice.Notice{Kind: notice.Reclaim, Deadline: now.Add(30 * time.Second), Source: "gcp", Detail: "instance/preempted TRUE"},
		},
		"gcp migrate": {
			provider: notice.ProviderGCP,
			routes:   map[string]string{gcpPreempted: "gcp/preempted-false.txt", gcpMaintenance: "gcp/maintenance-event-migrate.txt"},
			want:     notice.Notice{Kind: notice.EarlyWarning, Source: "gcp", Detail: "maintenance-event MIGRATE_ON_HOST_MAINTENANCE"},
		},
		"gcp terminate on maintenance": {
			provider: notice.ProviderGCP,
			routes:   map[string]string{gcpPreempted: "gcp/preempted-false.txt", gcpMaintenance: "gcp/maintenance-event-terminate.txt"},
			want:     notice.Notice{Kind: notice.EarlyWarning, Source: "gcp", Detail: "maintenance-event TERMINATE_ON_HOST_MAINTENANCE"},
		},
		"gcp none": {
			provider: notice.ProviderGCP,
			routes:   map[string]string{gcpPreempted: "gcp/preempted-false.txt", gcpMaintenance: "gcp/maintenance-event-none.txt"},
			want:     notice.Notice{Source: "gcp"},
		},
		"gcp malformed": {
			provider: notice.ProviderGCP,
			routes:   map[string]string{gcpPreempted: "gcp/preempted-malformed.txt"},
			wantErr:  `got "MAYBE"`,
		},
		"gcp 500": {
			provider: notice.ProviderGCP,
			routes:   map[string]string{gcpPreempted: "status:500"},
			wantErr:  "unexpected status 500",
		},
		"azure preempt": {
			provider: notice.ProviderAzure,
			routes:   map[string]string{azureEventsPath: "azure/scheduledevents-preempt.json"},
			want: notice.Notice{Kind: notice.Reclaim, Deadline: time.Date(2016, 9, 19, 18, 29, 47, 0, time.UTC), Source: "azure",
				Detail: "Preempt f020ba2e-3bc0-4c40-a10b-86575a9eabd5", EventID: "f020ba2e-3bc0-4c40-a10b-86575a9eabd5"},
		},
		"azure terminate": {
			provider: notice.ProviderAzure,
			routes:   map[string]string{azureEventsPath: "azure/scheduledevents-terminate.json"},
			want: notice.Notice{Kind: notice.Reclaim, Deadline: time.Date(2016, 9, 19, 18, 30, 47, 0, time.UTC), Source: "azure",
				Detail: "Terminate A123BC45-1234-5678-AB90-ABCDEF123456", EventID: "A123BC45-1234-5678-AB90-ABCDEF123456"},
		},
		"azure freeze": {
			provider: notice.ProviderAzure,
			routes:   map[string]string{azureEventsPath: "azure/scheduledevents-freeze.json"},
			want:     notice.Notice{Kind: notice.EarlyWarning, Source: "azure", Detail: "Freeze C7061BAC-AFDC-4513-B24B-AA5F13A16123", EventID: "C7061BAC-AFDC-4513-B24B-AA5F13A16123"},
		},
		"azure event for another VM": {
			provider: notice.ProviderAzure,
			routes:   map[string]string{azureEventsPath: "azure/scheduledevents-other-vm.json"},
			want:     notice.Notice{Source: "azure"},
		},
		"azure none": {
			provider: notice.ProviderAzure,
			routes:   map[string]string{azureEventsPath: "azure/scheduledevents-none.json"},
			want:     notice.Notice{Source: "azure"},
		},
		"azure malformed": {
			provider: notice.ProviderAzure,
			routes:   map[string]string{azureEventsPath: "azure/scheduledevents-malformed.json"},
			wantErr:  `NotBefore "yesterday"`,
		},
		"azure 500": {
			provider: notice.ProviderAzure,
			routes:   map[string]string{azureEventsPath: "status:500"},
			wantErr:  "unexpected status 500",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			base := serve(t, fixtureServer{t: t, routes: tc.routes})
			got, err := source(t, tc.provider, base).Poll(context.Background())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Poll() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Poll() error = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Poll() (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAzureOwnVM (finding H3): without a configured name the source reads
// this VM's name from the instance metadata and takes only its events: another
// VM's eviction in the scale set is no notice here.
func TestAzureOwnVM(t *testing.T) {
	routes := map[string]string{azureEventsPath: "azure/scheduledevents-other-vm.json", azureInstancePath: "azure/instance.json"}
	src := &notice.Azure{BaseURL: serve(t, fixtureServer{t: t, routes: routes})}
	got, err := src.Poll(context.Background())
	if err != nil || got.Kind != notice.None {
		t.Fatalf("another VM's Preempt: Poll() = %+v, %v, want none", got, err)
	}
	if src.VMName != "myspotvm" {
		t.Errorf("VMName = %q, want myspotvm from the instance metadata", src.VMName)
	}
	routes[azureEventsPath] = "azure/scheduledevents-preempt.json"
	if got, err := src.Poll(context.Background()); err != nil || got.Kind != notice.Reclaim {
		t.Errorf("its own Preempt: Poll() = %+v, %v, want a reclaim", got, err)
	}
	// No name to be had: an error, never every VM's events.
	delete(routes, azureInstancePath)
	if got, err := (&notice.Azure{BaseURL: serve(t, fixtureServer{t: t, routes: routes})}).Poll(context.Background()); err == nil || !strings.Contains(err.Error(), "--azure-vm-name") {
		t.Errorf("no instance metadata: Poll() = %+v, %v, want an error naming --azure-vm-name", got, err)
	}
}

// TestEmulator drives every provider through the emulated metadata service:
// reclaim, withdrawal, early warning, and back to none.
func TestEmulator(t *testing.T) {
	deadline := now.Add(2 * time.Minute)
	for _, p := range notice.Providers {
		t.Run(p, func(t *testing.T) {
			emu := emucloud.New()
			emu.Now = clock
			base := serve(t, emu)
			var src notice.Source
			switch p {
			case notice.ProviderGCP:
				src = &notice.GCP{BaseURL: base, Now: clock, Window: 15 * time.Second}
			case notice.ProviderAzure:
				src = &notice.Azure{BaseURL: base, VMName: emucloud.DefaultVMName}
			default:
				src = source(t, p, base)
			}
			poll := func() notice.Notice {
				t.Helper()
				n, err := src.Poll(context.Background())
				if err != nil {
					t.Fatalf("Poll() error = %v", err)
				}
				return n
			}
			if n := poll(); n.Kind != notice.None {
				t.Fatalf("before any notice: %+v, want None", n)
			}
			emu.SetReclaim(p, deadline)
			n := poll()
			wantDeadline := deadline
			if p == notice.ProviderGCP {
				wantDeadline = now.Add(15 * time.Second) // GCP has no time: the window
			}
			if n.Kind != notice.Reclaim || !n.Deadline.Equal(wantDeadline) || n.Source != p {
				t.Fatalf("after SetReclaim: %+v, want a reclaim from %s at %v", n, p, wantDeadline)
			}
			emu.Clear()
			if n := poll(); n.Kind != notice.None {
				t.Fatalf("after Clear: %+v, want None (withdrawn)", n)
			}
			emu.SetEarlyWarning(p)
			wantWarning := notice.EarlyWarning
			if p == notice.ProviderAlibaba {
				wantWarning = notice.None // ECS has no early warning
			}
			if n := poll(); n.Kind != wantWarning {
				t.Fatalf("after SetEarlyWarning: %+v, want %v", n, wantWarning)
			}
		})
	}
}

// TestEmulatorHeaders checks that the emulator refuses what the real
// services refuse: IMDSv2 without a token, GCP without Metadata-Flavor,
// Azure without Metadata: true.
func TestEmulatorHeaders(t *testing.T) {
	base := serve(t, emucloud.New())
	testCases := map[string]struct {
		method, path string
		header       http.Header
		want         int
	}{
		"aws without token":              {method: "GET", path: awsActionPath, want: http.StatusUnauthorized},
		"aws with a made-up token":       {method: "GET", path: awsActionPath, header: http.Header{"X-Aws-Ec2-Metadata-Token": {"nope"}}, want: http.StatusUnauthorized},
		"aws token without ttl":          {method: "PUT", path: "/latest/api/token", want: http.StatusBadRequest},
		"aws token with ttl":             {method: "PUT", path: "/latest/api/token", header: http.Header{"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": {"60"}}, want: http.StatusOK},
		"gcp without flavor":             {method: "GET", path: gcpPreempted, want: http.StatusForbidden},
		"gcp with flavor":                {method: "GET", path: gcpPreempted, header: http.Header{"Metadata-Flavor": {"Google"}}, want: http.StatusOK},
		"azure without metadata":         {method: "GET", path: azureEventsPath + "?api-version=2020-07-01", want: http.StatusBadRequest},
		"azure without api-version":      {method: "GET", path: azureEventsPath, header: http.Header{"Metadata": {"true"}}, want: http.StatusBadRequest},
		"azure with header":              {method: "GET", path: azureEventsPath + "?api-version=2020-07-01", header: http.Header{"Metadata": {"true"}}, want: http.StatusOK},
		"alibaba needs no header":        {method: "GET", path: "/latest/meta-data/instance-id", want: http.StatusOK},
		"alibaba none is 404":            {method: "GET", path: alibabaPath, want: http.StatusNotFound},
		"unknown path":                   {method: "GET", path: "/nothing", want: http.StatusNotFound},
		"gcp forwarded is refused":       {method: "GET", path: gcpPreempted, header: http.Header{"Metadata-Flavor": {"Google"}, "X-Forwarded-For": {"1.2.3.4"}}, want: http.StatusForbidden},
		"aws forwarded token is refused": {method: "PUT", path: "/latest/api/token", header: http.Header{"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": {"60"}, "X-Forwarded-For": {"1.2.3.4"}}, want: http.StatusForbidden},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, base+tc.path, nil)
			for k, v := range tc.header {
				req.Header[k] = v
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%s %s: status %d, want %d", tc.method, tc.path, resp.StatusCode, tc.want)
			}
		})
	}
}

// countingHandler counts requests per method and path.
type countingHandler struct {
	h  http.Handler
	mu sync.Mutex
	n  map[string]int
}

func (c *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[r.Method+" "+r.URL.Path]++
	c.mu.Unlock()
	c.h.ServeHTTP(w, r)
}

func (c *countingHandler) count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// TestAWSToken caches the IMDSv2 token, refreshes it before it expires and
// fetches a new one when the service answers 401.
func TestAWSToken(t *testing.T) {
	emu := emucloud.New()
	counter := &countingHandler{h: emu}
	base := serve(t, counter)
	at := now
	src := &notice.AWS{BaseURL: base, TokenTTL: 100 * time.Second, Now: func() time.Time { return at }}
	const put = "PUT /latest/api/token"
	for range 3 {
		if _, err := src.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := counter.count(put); got != 1 {
		t.Errorf("token requests after 3 polls = %d, want 1 (cached)", got)
	}
	at = at.Add(81 * time.Second) // past 80% of the TTL
	if _, err := src.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := counter.count(put); got != 2 {
		t.Errorf("token requests near expiry = %d, want 2 (refreshed)", got)
	}
	emu.RevokeTokens()
	emu.SetReclaim(emucloud.AWS, now.Add(time.Minute))
	n, err := src.Poll(context.Background())
	if err != nil {
		t.Fatalf("Poll() after the tokens were revoked: %v", err)
	}
	if n.Kind != notice.Reclaim {
		t.Errorf("Poll() after revocation = %+v, want a reclaim", n)
	}
	if got := counter.count(put); got != 3 {
		t.Errorf("token requests after a 401 = %d, want 3 (re-fetched)", got)
	}
}

// TestAzureAck acknowledges the event through StartRequests.
func TestAzureAck(t *testing.T) {
	emu := emucloud.New()
	base := serve(t, emu)
	src := &notice.Azure{BaseURL: base, VMName: emucloud.DefaultVMName}
	emu.SetReclaim(emucloud.Azure, now.Add(time.Minute))
	n, err := src.Poll(context.Background())
	if err != nil || n.EventID == "" {
		t.Fatalf("Poll() = %+v, %v, want a reclaim with an event id", n, err)
	}
	if err := src.Ack(context.Background(), n.EventID); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{n.EventID}, emu.Acks()); diff != "" {
		t.Errorf("acks (-want +got):\n%s", diff)
	}
}

// TestGCPWaitForChange long-polls instance/preempted: the answer comes as
// soon as the value changes, not at the end of the timeout.
func TestGCPWaitForChange(t *testing.T) {
	emu := emucloud.New()
	base := serve(t, emu)
	src := &notice.GCP{BaseURL: base, WaitTimeout: 30 * time.Second}
	if n, err := src.Poll(context.Background()); err != nil || n.Kind != notice.None {
		t.Fatalf("first Poll() = %+v, %v", n, err)
	}
	done := make(chan notice.Notice, 1)
	go func() {
		n, err := src.Poll(context.Background())
		if err != nil {
			t.Error(err)
		}
		done <- n
	}()
	time.Sleep(50 * time.Millisecond)
	emu.SetReclaim(emucloud.GCP, time.Time{})
	select {
	case n := <-done:
		if n.Kind != notice.Reclaim {
			t.Errorf("Poll() = %+v, want a reclaim", n)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the long poll did not return on the change")
	}
}

// TestUnreachable covers timeouts and refused connections: an error, never
// a notice.
func TestUnreachable(t *testing.T) {
	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(hang); slow.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + l.Addr().String()
	l.Close()
	client := &http.Client{Timeout: 100 * time.Millisecond}
	for _, p := range notice.Providers {
		for name, base := range map[string]string{"timeout": slow.URL, "refused": refused} {
			t.Run(p+" "+name, func(t *testing.T) {
				src, err := notice.New(p, notice.Options{BaseURL: base, Client: client})
				if err != nil {
					t.Fatal(err)
				}
				n, err := src.Poll(context.Background())
				if err == nil {
					t.Fatalf("Poll() = %+v, nil; want an error", n)
				}
				var d notice.Debouncer
				if got, changed := d.Observe(n, err, now); got.Kind != notice.None || changed {
					t.Errorf("Observe(error) = %+v, %v; want None, unchanged", got, changed)
				}
			})
		}
	}
}

var errDown = errors.New("connection refused")

// TestDebouncer: flapping answers need Confirm identical readings, a
// withdrawn notice cancels, errors keep the last notice, and a deadline in
// the past is clamped to now.
func TestDebouncer(t *testing.T) {
	reclaim := notice.Notice{Kind: notice.Reclaim, Deadline: now.Add(time.Minute), Source: "aws"}
	reclaim2 := notice.Notice{Kind: notice.Reclaim, Deadline: now.Add(2 * time.Minute), Source: "aws"}
	past := notice.Notice{Kind: notice.Reclaim, Deadline: now.Add(-time.Hour), Source: "alibaba"}
	pastClamped := past
	pastClamped.Deadline = now
	none := notice.Notice{Source: "aws"}
	warn := notice.Notice{Kind: notice.EarlyWarning, Source: "aws"}
	type reading struct {
		n   notice.Notice
		err error
	}
	type step struct {
		n       notice.Notice
		changed bool
	}
	testCases := map[string]struct {
		confirm  int
		readings []reading
		want     []step
	}{
		"confirm 1 reports at once and cancels": {
			confirm:  1,
			readings: []reading{{n: reclaim}, {n: reclaim}, {n: none}},
			want:     []step{{reclaim, true}, {reclaim, false}, {none, true}},
		},
		"flapping never reaches 2 identical readings": {
			confirm:  2,
			readings: []reading{{n: reclaim}, {n: none}, {n: reclaim}, {n: none}, {n: reclaim2}, {n: reclaim}},
			want:     []step{{}, {}, {}, {}, {}, {}},
		},
		"two identical readings report": {
			confirm:  2,
			readings: []reading{{n: none}, {n: none}, {n: reclaim}, {n: reclaim}, {n: reclaim}},
			want:     []step{{}, {none, true}, {none, false}, {reclaim, true}, {reclaim, false}},
		},
		"an earlier deadline needs confirming too": {
			confirm:  2,
			readings: []reading{{n: reclaim2}, {n: reclaim2}, {n: reclaim}, {n: reclaim}},
			want:     []step{{}, {reclaim2, true}, {reclaim2, false}, {reclaim, true}},
		},
		"a later deadline never replaces the reported one": {
			confirm:  2,
			readings: []reading{{n: reclaim}, {n: reclaim}, {n: reclaim2}, {n: reclaim2}, {n: reclaim2}, {n: none}, {n: none}},
			want:     []step{{}, {reclaim, true}, {reclaim, false}, {reclaim, false}, {reclaim, false}, {reclaim, false}, {none, true}},
		},
		"withdrawn after confirming": {
			confirm:  2,
			readings: []reading{{n: reclaim}, {n: reclaim}, {n: none}, {n: none}},
			want:     []step{{}, {reclaim, true}, {reclaim, false}, {none, true}},
		},
		"errors keep the notice and break a streak": {
			confirm:  2,
			readings: []reading{{n: reclaim}, {n: reclaim}, {err: errDown}, {n: none}, {err: errDown}, {n: none}, {n: none}},
			want:     []step{{}, {reclaim, true}, {reclaim, false}, {reclaim, false}, {reclaim, false}, {reclaim, false}, {none, true}},
		},
		"past deadline clamped to now": {
			confirm:  1,
			readings: []reading{{n: past}, {n: past}},
			want:     []step{{pastClamped, true}, {pastClamped, false}},
		},
		"early warning": {
			confirm:  1,
			readings: []reading{{n: warn}, {n: reclaim}, {n: warn}},
			want:     []step{{warn, true}, {reclaim, true}, {warn, true}},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			d := notice.Debouncer{Confirm: tc.confirm}
			var got []step
			for _, r := range tc.readings {
				n, changed := d.Observe(r.n, r.err, now)
				got = append(got, step{n, changed})
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(step{})); diff != "" {
				t.Errorf("reported (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWatch runs the poll loop against the emulator: the first settled
// answer, a reclaim, and its withdrawal each reach onChange once.
func TestWatch(t *testing.T) {
	emu := emucloud.New()
	base := serve(t, emu)
	src, _ := notice.New(notice.ProviderAWS, notice.Options{BaseURL: base})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan notice.Notice, 10)
	go notice.Watch(ctx, src, 10*time.Millisecond, &notice.Debouncer{Confirm: 2}, nil, func(n notice.Notice) { got <- n })
	next := func(want notice.Kind) {
		t.Helper()
		select {
		case n := <-got:
			if n.Kind != want {
				t.Fatalf("onChange(%+v), want %v", n, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no onChange, want %v", want)
		}
	}
	next(notice.None)
	emu.SetReclaim(emucloud.AWS, time.Now().Add(time.Minute))
	next(notice.Reclaim)
	emu.Clear()
	next(notice.None)
}

// TestWatchConfirmsQuickly: the reading that confirms a change comes
// ConfirmInterval after the first, not a poll interval (here an hour) later.
func TestWatchConfirmsQuickly(t *testing.T) {
	emu := emucloud.New()
	emu.SetReclaim(emucloud.AWS, time.Now().Add(time.Minute))
	src, _ := notice.New(notice.ProviderAWS, notice.Options{BaseURL: serve(t, emu)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan notice.Notice, 1)
	go notice.Watch(ctx, src, time.Hour, &notice.Debouncer{Confirm: 2}, nil, func(n notice.Notice) { got <- n })
	select {
	case n := <-got:
		if n.Kind != notice.Reclaim {
			t.Fatalf("onChange(%+v), want a reclaim", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reclaim was not confirmed before the next hourly poll")
	}
}

func TestDebouncerConfirming(t *testing.T) {
	d := &notice.Debouncer{Confirm: 2}
	now := time.Now()
	reclaim := notice.Notice{Kind: notice.Reclaim, Deadline: now.Add(time.Minute)}
	steps := []struct {
		n    notice.Notice
		want bool
	}{
		{notice.Notice{}, true},  // the first answer is not settled yet
		{notice.Notice{}, false}, // settled: None
		{notice.Notice{}, false}, // nothing new
		{reclaim, true},          // a change waits for its confirmation
		{reclaim, false},         // confirmed
		{reclaim, false},
		{notice.Notice{}, true}, // a withdrawal is confirmed the same way
		{reclaim, false},        // flapping back to what is reported: nothing to confirm
	}
	for i, s := range steps {
		d.Observe(s.n, nil, now)
		if got := d.Confirming(); got != s.want {
			t.Errorf("reading %d (%v): Confirming() = %v, want %v", i, s.n.Kind, got, s.want)
		}
	}
}

// TestDetect finds a provider that answers and none where nothing listens.
func TestDetect(t *testing.T) {
	var calls atomic.Int32
	onlyAzure := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path == "/metadata/instance" && r.Header.Get("Metadata") == "true" {
			fmt.Fprint(w, `{"compute":{}}`)
			return
		}
		http.NotFound(w, r)
	}))
	if src := notice.Detect(context.Background(), notice.Options{BaseURL: onlyAzure}, time.Second); src == nil || src.Provider() != notice.ProviderAzure {
		t.Errorf("Detect(azure-like) = %v, want azure", src)
	}
	if calls.Load() != 4 {
		t.Errorf("probes = %d, want 4 (one per provider)", calls.Load())
	}
	emu := serve(t, emucloud.New())
	if src := notice.Detect(context.Background(), notice.Options{BaseURL: emu}, time.Second); src == nil || src.Provider() != notice.ProviderAlibaba {
		t.Errorf("Detect(emulator) = %v, want alibaba (first in order)", src)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	refused := "http://" + l.Addr().String()
	l.Close()
	if src := notice.Detect(context.Background(), notice.Options{BaseURL: refused}, 200*time.Millisecond); src != nil {
		t.Errorf("Detect(nothing) = %v, want nil", src)
	}
}

// TestNewUnknown names the provider it does not know.
func TestNewUnknown(t *testing.T) {
	if _, err := notice.New("oracle", notice.Options{}); err == nil || !strings.Contains(err.Error(), `"oracle"`) {
		t.Errorf("New(oracle) error = %v, want one naming it", err)
	}
}

// TestDetectOneCloud: on an emulated VM of one cloud (emucloud.Server.Only,
// as each local-cluster node has), auto-detection finds that cloud, AWS
// included, whose /latest/meta-data/instance-id asks for a token where
// Alibaba's does not.
func TestDetectOneCloud(t *testing.T) {
	for _, p := range notice.Providers {
		emu := emucloud.New()
		emu.Only = p
		src := notice.Detect(context.Background(), notice.Options{BaseURL: serve(t, emu)}, time.Second)
		if src == nil || src.Provider() != p {
			t.Errorf("Detect(%s only) = %v, want %s", p, src, p)
		}
	}
}
