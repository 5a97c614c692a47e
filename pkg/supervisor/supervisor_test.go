package supervisor_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/pkg/supervisor"
)

// agentStub answers /v1/signal with whatever the test sets and records
// /v1/progress bodies; the real agent is exercised in internal/agent's
// TestAgent with pod-bound tokens.
type agentStub struct {
	mu       sync.Mutex
	status   int
	answer   string
	progress []supervisor.Progress
	auth     []string
	queries  []string
}

func (a *agentStub) set(status int, answer string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.status, a.answer = status, answer
}

func (a *agentStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.auth = append(a.auth, r.Header.Get("Authorization"))
	a.queries = append(a.queries, r.URL.RawQuery)
	if r.URL.Query().Get("pod") != "w-0" || r.URL.Query().Get("namespace") != "ml" {
		http.Error(w, "wrong pod", http.StatusForbidden)
		return
	}
	switch r.URL.Path {
	case "/v1/signal":
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.answer))
	case "/v1/progress":
		var p supervisor.Progress
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		a.progress = append(a.progress, p)
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

func newSupervisor(t *testing.T, addr string) (*supervisor.Supervisor, *[]string, *int) {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("pod-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs []string
	exit := -1
	s := supervisor.New(supervisor.Options{AgentAddr: addr, Namespace: "ml", Pod: "w-0", TokenPath: tok, NoSIGTERM: true,
		Log: func(m string) { logs = append(logs, m) }, Exit: func(c int) { exit = c }})
	return s, &logs, &exit
}

// TestHeartbeat checks the heartbeat a poll carries: none before a step, then
// the CheckAlive calls with $WORLD_SIZE and $ETJOB_RDZV_ROUND, or what Beat
// said.
func TestHeartbeat(t *testing.T) {
	stub := &agentStub{status: http.StatusOK, answer: `{"action":"none"}`}
	srv := httptest.NewServer(stub)
	defer srv.Close()
	t.Setenv("WORLD_SIZE", "4")
	t.Setenv("ETJOB_RDZV_ROUND", "7")
	s, _, _ := newSupervisor(t, srv.URL)
	ctx := context.Background()
	last := func() string {
		stub.mu.Lock()
		defer stub.mu.Unlock()
		return stub.queries[len(stub.queries)-1]
	}
	if err := s.PollOnce(ctx); err != nil || last() != "namespace=ml&pod=w-0" {
		t.Errorf("poll before a step: %q %v", last(), err)
	}
	s.CheckAlive()
	s.CheckAlive()
	if err := s.PollOnce(ctx); err != nil || last() != "namespace=ml&pod=w-0&round=7&step=2&world=4" {
		t.Errorf("poll after two steps: %q %v", last(), err)
	}
	s.Beat(120, 3, 9)
	if err := s.PollOnce(ctx); err != nil || last() != "namespace=ml&pod=w-0&round=9&step=120&world=3" {
		t.Errorf("poll after Beat: %q %v", last(), err)
	}
}

func TestSignals(t *testing.T) {
	stub := &agentStub{}
	srv := httptest.NewServer(stub)
	defer srv.Close()
	s, logs, _ := newSupervisor(t, strings.TrimPrefix(srv.URL, "http://"))
	ctx := context.Background()

	steps := []struct {
		name                string
		status              int
		answer              string
		wantErr             bool
		wantAlive, wantCkpt bool
		wantReason          string
	}{
		{"none", 200, `{"action":"none"}`, false, true, false, ""},
		{"early warning", 200, `{"action":"checkpoint","reason":"EarlyWarning(aws-rebalance)","source":"aws"}`, false, true, true, "EarlyWarning(aws-rebalance)"},
		// One checkpoint per warning, not one per step while it lasts.
		{"malformed answer keeps the last one", 200, `{"action":`, true, true, false, "EarlyWarning(aws-rebalance)"},
		{"unknown action keeps the last one", 200, `{"action":"dance"}`, true, true, false, "EarlyWarning(aws-rebalance)"},
		{"agent error keeps the last one", 503, `restarting`, true, true, false, "EarlyWarning(aws-rebalance)"},
		{"leave", 200, `{"action":"leave","reason":"ReclaimNotice(gcp)","deadline":"2026-11-29T12:00:30Z","source":"gcp"}`, false, false, true, "ReclaimNotice(gcp)"},
		// Finding M5: a leave stands. A later "none" (an agent restarted
		// during the notice) must not send the rank back to training.
		{"a later none does not undo a leave", 200, `{"action":"none"}`, false, false, true, "ReclaimNotice(gcp)"},
	}
	for _, st := range steps {
		stub.set(st.status, st.answer)
		err := s.PollOnce(ctx)
		if (err != nil) != st.wantErr {
			t.Errorf("%s: PollOnce() = %v, want error %v", st.name, err, st.wantErr)
		}
		if s.CheckAlive() != st.wantAlive || s.ShouldCheckpoint() != st.wantCkpt || s.Reason() != st.wantReason {
			t.Errorf("%s: alive %v checkpoint %v reason %q, want %v %v %q", st.name, s.CheckAlive(), s.ShouldCheckpoint(), s.Reason(),
				st.wantAlive, st.wantCkpt, st.wantReason)
		}
		if st.name == "leave" {
			if d, ok := s.Deadline(); !ok || !d.Equal(time.Date(2026, 11, 29, 12, 0, 30, 0, time.UTC)) {
				t.Errorf("deadline %v %v", d, ok)
			}
		}
	}
	for _, a := range stub.auth {
		if a != "Bearer pod-token" {
			t.Errorf("Authorization %q, want the pod's token", a)
		}
	}
	if len(*logs) == 0 {
		t.Error("a malformed answer logged nothing")
	}
}

// TestTrainThroughNotice: a leave with a stop time keeps the worker alive
// until then, with one checkpoint at the notice; a stop time the agent moves
// earlier is followed.
func TestTrainThroughNotice(t *testing.T) {
	stub := &agentStub{}
	srv := httptest.NewServer(stub)
	defer srv.Close()
	s, logs, _ := newSupervisor(t, srv.URL)
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	s = supervisor.New(supervisor.Options{AgentAddr: srv.URL, Namespace: "ml", Pod: "w-0", NoSIGTERM: true,
		Log: func(m string) { *logs = append(*logs, m) }, Now: func() time.Time { return now }})
	ctx := context.Background()
	poll := func(answer string) {
		t.Helper()
		stub.set(200, answer)
		if err := s.PollOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	poll(`{"action":"leave","reason":"ReclaimNotice(aws)","deadline":"2026-11-29T12:02:00Z","source":"aws","stopAt":"2026-11-29T12:01:30Z"}`)
	if !s.CheckAlive() || !s.ShouldCheckpoint() || s.ShouldCheckpoint() {
		t.Errorf("at the notice: alive %v, want true, and one checkpoint", s.CheckAlive())
	}
	if at, ok := s.StopAt(); !ok || !at.Equal(now.Add(90*time.Second)) {
		t.Errorf("StopAt() = %v %v, want 12:01:30", at, ok)
	}
	now = now.Add(89 * time.Second)
	if !s.CheckAlive() || s.ShouldCheckpoint() {
		t.Errorf("a second before the stop: alive %v checkpoint %v, want true false", s.CheckAlive(), s.ShouldCheckpoint())
	}
	now = now.Add(time.Second)
	if s.CheckAlive() || !s.ShouldCheckpoint() {
		t.Errorf("at the stop time: alive %v checkpoint %v, want false true", s.CheckAlive(), s.ShouldCheckpoint())
	}
	now = now.Add(-30 * time.Second)
	poll(`{"action":"leave","reason":"ReclaimNotice(aws)","deadline":"2026-11-29T12:01:20Z","source":"aws","stopAt":"2026-11-29T12:00:50Z"}`)
	if s.CheckAlive() {
		t.Errorf("the deadline moved earlier, past the new stop time: still alive")
	}
	if !strings.Contains(strings.Join(*logs, "\n"), "training on until 2026-11-29T12:01:30Z") {
		t.Errorf("logs %q do not say the stop time", *logs)
	}
}

func TestProgressAndExit(t *testing.T) {
	stub := &agentStub{}
	srv := httptest.NewServer(stub)
	defer srv.Close()
	s, _, exit := newSupervisor(t, srv.URL)
	want := supervisor.Progress{Step: 120, CheckpointStep: 100, CheckpointPath: "/ckpt/step-100", CheckpointSeconds: 1.5, SamplesPerSecond: 812.5}
	if err := s.ReportProgress(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	if len(stub.progress) != 1 || stub.progress[0] != want {
		t.Errorf("agent received %+v, want %+v", stub.progress, want)
	}
	s.ExitPreempted()
	if *exit != supervisor.ExitCodePreempted || supervisor.ExitCodePreempted != etjobv1.ExitCodePreempted {
		t.Errorf("exit code %d; library %d, API %d", *exit, supervisor.ExitCodePreempted, etjobv1.ExitCodePreempted)
	}
}

// TestSIGTERM sends this process a real SIGTERM: it becomes a stop, not death.
func TestSIGTERM(t *testing.T) {
	var mu sync.Mutex
	var logs []string
	s := supervisor.New(supervisor.Options{AgentAddr: "", Namespace: "ml", Pod: "w-0",
		Log: func(m string) { mu.Lock(); logs = append(logs, m); mu.Unlock() }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.Start(ctx)
	time.Sleep(50 * time.Millisecond) // signal.Notify is installed by Start, synchronously
	if !s.CheckAlive() {
		t.Fatal("not alive before SIGTERM")
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.CheckAlive() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.CheckAlive() || s.Reason() != "SIGTERM" || !s.ShouldCheckpoint() {
		t.Errorf("after SIGTERM: alive %v reason %q", s.CheckAlive(), s.Reason())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(logs) < 2 || !strings.Contains(logs[0], "ETJOB_AGENT_ADDR is not set") {
		t.Errorf("logs %q: want the missing agent said once, then the SIGTERM", logs)
	}
}

// TestNoTokenByDefault (issue #26, L3): without a token for the agent
// ($ETJOB_AGENT_TOKEN_PATH, Options.TokenPath) a poll carries none; the
// pod's API token is never sent by default over the agent's plain HTTP.
func TestNoTokenByDefault(t *testing.T) {
	stub := &agentStub{status: http.StatusOK, answer: `{"action":"none"}`}
	srv := httptest.NewServer(stub)
	defer srv.Close()
	t.Setenv("ETJOB_AGENT_TOKEN_PATH", "")
	s := supervisor.New(supervisor.Options{AgentAddr: srv.URL, Namespace: "ml", Pod: "w-0", NoSIGTERM: true,
		Log: func(string) {}, Exit: func(int) {}})
	if err := s.PollOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	stub.mu.Lock()
	defer stub.mu.Unlock()
	if len(stub.auth) != 1 || stub.auth[0] != "" {
		t.Errorf("Authorization headers %q, want none", stub.auth)
	}
}

// TestContractNames holds this package's copies of the worker contract's
// names equal to their owner, api/v1alpha1 (this package imports only the
// standard library).
func TestContractNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{supervisor.EnvAgentAddr, etjobv1.EnvAgentAddr},
		{supervisor.EnvNamespace, etjobv1.EnvNamespace},
		{supervisor.EnvPodName, etjobv1.EnvPodName},
		{supervisor.EnvAgentTokenPath, etjobv1.EnvAgentTokenPath},
		{supervisor.EnvRendezvousRound, etjobv1.EnvRendezvousRound},
	} {
		if c.got != c.want {
			t.Errorf("supervisor has %q where api/v1alpha1 has %q", c.got, c.want)
		}
	}
}
