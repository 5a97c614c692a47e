package localcluster

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWaitPortsFree: a port still held (the last cluster's control plane,
// shutting down) is waited for, and named when it stays held.
func TestWaitPortsFree(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	err = waitPortsFree(context.Background(), 300*time.Millisecond, port)
	if err == nil || !strings.Contains(err.Error(), "still in use") {
		t.Fatalf("a held port: %v", err)
	}
	go func() { time.Sleep(300 * time.Millisecond); l.Close() }()
	if err := waitPortsFree(context.Background(), 5*time.Second, port); err != nil {
		t.Errorf("a port freed while waiting: %v", err)
	}
}

// TestNet: a cluster's Net moves its control plane's ports and its nodes'
// /16, so that two clusters run side by side; a Cluster made from its Dir
// alone (etjob-local cluster add-node) finds the Net Up recorded there.
func TestNet(t *testing.T) {
	dir := t.TempDir()
	zero := &Cluster{Dir: dir}
	if got := zero.port(APIServerPort); got != APIServerPort {
		t.Errorf("Net 0: the API server on %d, want %d", got, APIServerPort)
	}
	if got := (NodeSpec{Index: 101}).NodeIP(); got != "127.0.101.1" {
		t.Errorf("Net 0: node IP %s", got)
	}
	two := &Cluster{Dir: dir, Net: 2}
	if got := two.port(APIServerPort); got != APIServerPort+2*NetStride {
		t.Errorf("Net 2: the API server on %d", got)
	}
	if got := (NodeSpec{Index: 101, Net: 2}).NodeIP(); got != "127.2.101.1" {
		t.Errorf("Net 2: node IP %s", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "net"), []byte("2\n"), 0o644); err != nil { // as Up records it
		t.Fatal(err)
	}
	if got := zero.port(EtcdClientPort); got != EtcdClientPort+2*NetStride {
		t.Errorf("a Cluster made from Dir alone: etcd on %d, want Net 2's", got)
	}
	all := map[int]bool{}
	for n := 0; n <= MaxNet; n++ {
		c := &Cluster{Dir: t.TempDir(), Net: n}
		for _, p := range []int{EtcdClientPort, EtcdPeerPort, APIServerPort, SchedulerPort, KCMPort} {
			if all[c.port(p)] || c.port(p) >= 32768 {
				t.Errorf("Net %d: port %d taken by another Net, or in the ephemeral range", n, c.port(p))
			}
			all[c.port(p)] = true
		}
	}
	if err := (&Cluster{Dir: t.TempDir(), Net: MaxNet + 1}).StartControlPlane(context.Background()); err == nil ||
		!strings.Contains(err.Error(), "Net 6 is not in 0..5") {
		t.Errorf("Net %d: %v", MaxNet+1, err)
	}
}
