package localcli

import (
	"strings"
	"testing"

	"github.com/etjob/etjob/internal/testutil"
)

// TestExampleRepo: the local cluster's pods need the repository; from a
// directory outside it, and from a binary that was not built into it, the
// verbs that start nodes refuse, naming --repo, instead of running pods
// without the local image (a horovod job then failed with "horovodrun: not
// found").
func TestExampleRepo(t *testing.T) {
	root, err := testutil.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := exampleRepo(root); err != nil || got != root {
		t.Errorf("exampleRepo(%q) = %q, %v; want the repository", root, got, err)
	}
	if _, err := exampleRepo(t.TempDir()); err == nil || !strings.Contains(err.Error(), "--repo") {
		t.Errorf("--repo of a directory without the examples: error %v, want one naming --repo", err)
	}
	// Outside any git work tree, from a test binary built outside the
	// repository: nothing to find.
	t.Chdir(t.TempDir())
	if got, err := exampleRepo(""); err == nil || !strings.Contains(err.Error(), "pass --repo DIR") {
		t.Errorf("exampleRepo(\"\") outside the repository = %q, %v; want an error naming --repo", got, err)
	}
	o := &clusterOptions{dir: t.TempDir()}
	if _, err := o.nodeCluster(); err == nil {
		t.Error("cluster up outside the repository: no error")
	}
	if _, err := o.cluster(); err != nil {
		t.Errorf("cluster down/status outside the repository: %v (they need no repository)", err)
	}
}
