package localcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBinariesIn(t *testing.T) {
	dir := t.TempDir()
	if _, err := BinariesIn(dir); err == nil || !strings.Contains(err.Error(), "etjob-controller, etjob-node, etjob-agent is not there") || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("empty dir: %v", err)
	}
	write := func(name string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("etjob-controller", 0o755)
	write("etjob-node", 0o644) // not executable
	if _, err := BinariesIn(dir); err == nil || !strings.Contains(err.Error(), "etjob-node, etjob-agent is not there") {
		t.Fatalf("two missing: %v", err)
	}
	if err := os.Chmod(filepath.Join(dir, "etjob-node"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("etjob-agent", 0o755)
	b, err := BinariesIn(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b.Controller != filepath.Join(dir, "etjob-controller") || b.Node != filepath.Join(dir, "etjob-node") || b.Agent != filepath.Join(dir, "etjob-agent") {
		t.Errorf("%+v", b)
	}
	c := &Cluster{Binaries: b}
	if got, err := c.binaries(); err != nil || got != b {
		t.Errorf("binaries() = %+v, %v; want the set ones", got, err)
	}
}
