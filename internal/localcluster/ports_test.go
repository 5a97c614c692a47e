package localcluster

import (
	"context"
	"net"
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
