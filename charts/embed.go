// Package charts embeds etjob's Helm chart (charts/etjob), the one source of
// its install manifests: internal/chart renders it, `make manifests` writes
// the kustomize tree in config/ from it, and the local cluster installs it.
package charts

import (
	"embed"
	"io/fs"
)

//go:embed all:etjob
var files embed.FS

// Etjob is the chart's directory tree (Chart.yaml at its root).
func Etjob() fs.FS {
	sub, err := fs.Sub(files, "etjob")
	if err != nil {
		panic(err) // the embed pattern names it
	}
	return sub
}
