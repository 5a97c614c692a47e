package processnode

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Image is what a process node runs for a container image. A process node
// pulls nothing and runs the host's binaries, so an image is emulated by what
// a real one would bring: environment defaults (its ENV lines: PATH first of
// all, which picks the interpreter) and files (bind-mounted read-only at
// their paths, as if baked in). The container's own env overrides the
// image's, as with a container runtime.
type Image struct {
	// Image is the image reference this entry stands for: exact, a prefix
	// ending in "*" ("registry.example.com/ml/*"), or "*" for every image
	// no other entry matches.
	Image string `json:"image"`
	// Env is the image's environment (name to value).
	Env map[string]string `json:"env,omitempty"`
	// Files maps a path in the container to the host path that holds its
	// content (a directory or a file).
	Files map[string]string `json:"files,omitempty"`
}

// Images is a process node's image table.
type Images []Image

// Lookup returns the entry for ref: an exact match first, then the longest
// matching prefix, then "*". ok is false when nothing matches (the host as
// it is: its PATH, no files).
func (t Images) Lookup(ref string) (Image, bool) {
	best, bestLen, found := Image{}, -1, false
	for _, im := range t {
		switch {
		case im.Image == ref:
			return im, true
		case strings.HasSuffix(im.Image, "*") && strings.HasPrefix(ref, strings.TrimSuffix(im.Image, "*")):
			if n := len(im.Image) - 1; n > bestLen {
				best, bestLen, found = im, n, true
			}
		}
	}
	return best, found
}

// mounts are the image's files as read-only bind mounts, sorted by path so
// that a parent is mounted before its children.
func (im Image) mounts() []mount {
	targets := make([]string, 0, len(im.Files))
	for t := range im.Files {
		targets = append(targets, t)
	}
	sort.Strings(targets)
	out := make([]mount, 0, len(targets))
	for _, t := range targets {
		out = append(out, mount{source: im.Files[t], target: t, readOnly: true})
	}
	return out
}

// ReadImages reads an image table from a JSON file (a list of Image); an
// empty path is an empty table.
func ReadImages(path string) (Images, error) {
	if path == "" {
		return nil, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var t Images
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, im := range t {
		if im.Image == "" {
			return nil, fmt.Errorf("%s: entry %d has no image", path, i)
		}
		for target, src := range im.Files {
			if !filepath.IsAbs(target) || !filepath.IsAbs(src) {
				return nil, fmt.Errorf("%s: image %q: files %q -> %q: both paths must be absolute", path, im.Image, target, src)
			}
		}
	}
	return t, nil
}

// WriteImages writes an image table for ReadImages.
func WriteImages(path string, t Images) error {
	raw, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	// Atomically (a temp file, then a rename): the cluster rewrites the
	// table at every node's start while the nodes started before read it,
	// and a reader of the truncated file failed ("--images: unexpected end
	// of JSON input", a node never Ready, in a clean-clone make test).
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(append(raw, '\n')); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}
