package localcluster

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

// TestProcIDs reads this test process's own ids as KillPodProcess reads a
// pod process's: the host PID, the PID in its innermost namespace (the same
// here: no namespace of its own) and its process group.
func TestProcIDs(t *testing.T) {
	host, inner, group, ok := procIDs(fmt.Sprintf("/proc/%d/status", os.Getpid()))
	if !ok || host != os.Getpid() || inner != os.Getpid() || group != syscall.Getpgrp() {
		t.Fatalf("procIDs = %d, %d, %d, %v; want %d, %d, %d, true", host, inner, group, ok, os.Getpid(), os.Getpid(), syscall.Getpgrp())
	}
	if _, _, _, ok := procIDs("/proc/0/status"); ok {
		t.Fatal("procIDs of no process said ok")
	}
}
