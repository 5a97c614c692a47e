// Command manifests writes the kustomize tree in config/ from the Helm chart
// (internal/chart.Kustomize), the manifests' one source: `make manifests`.
// With -check it writes nothing and fails when config/ differs, naming each
// file that would change.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/etjob/etjob/internal/chart"
)

func main() {
	dir := flag.String("dir", "config", "the kustomize tree to write")
	check := flag.Bool("check", false, "only report files that differ")
	flag.Parse()
	if err := run(*dir, *check); err != nil {
		fmt.Fprintln(os.Stderr, "manifests:", err)
		os.Exit(1)
	}
}

func run(dir string, check bool) error {
	want, err := chart.Kustomize()
	if err != nil {
		return err
	}
	stale, err := chart.Diff(dir, want)
	if err != nil {
		return err
	}
	if check {
		if len(stale) > 0 {
			return fmt.Errorf("%s is not the chart's rendering (run make manifests): %v", dir, stale)
		}
		return nil
	}
	for _, rel := range stale {
		p := filepath.Join(dir, rel)
		content, ok := want[rel]
		if !ok {
			if err := os.Remove(p); err != nil {
				return err
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", p)
	}
	return nil
}
