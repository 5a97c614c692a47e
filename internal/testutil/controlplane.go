package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// RepoRoot returns the repository's root directory.
func RepoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// ControlPlaneAssets returns the directory of kube-apiserver, etcd and the rest
// of the control plane, for envtest's KUBEBUILDER_ASSETS: the variable when
// set, else what hack/build-controlplane.sh prints (it builds once and caches).
func ControlPlaneAssets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(filepath.Join(root, "hack/build-controlplane.sh")).Output()
	if err != nil {
		return "", fmt.Errorf("hack/build-controlplane.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
