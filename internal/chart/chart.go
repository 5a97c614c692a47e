// Package chart renders etjob's Helm chart (charts/etjob) with Helm's own
// engine, as `helm template` does: the kustomize tree in config/ is its
// rendering with the default values (`make manifests`), and the local
// cluster installs its rendering with the local values.
package chart

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/etjob/etjob/charts"
)

// ReleaseName is the release name the renderings use.
const ReleaseName = "etjob"

// File is one rendered file: a template's output, or a CRD from crds/.
type File struct {
	// Path is relative to the chart: templates/manager.yaml, crds/....
	Path string
	// Content is the YAML as rendered (comments kept).
	Content string
}

// Load loads the embedded chart.
func Load() (*chart.Chart, error) {
	var files []*loader.BufferedFile
	err := fs.WalkDir(charts.Etjob(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(charts.Etjob(), p)
		if err != nil {
			return err
		}
		files = append(files, &loader.BufferedFile{Name: p, Data: data})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return loader.LoadFiles(files)
}

// Render renders the chart with values over its defaults (nested maps, as
// `helm --set` and values files give them) and returns the CRDs, then the
// templates' outputs, each sorted by path; templates that render to nothing
// (a disabled part) are left out.
func Render(values map[string]any) ([]File, error) {
	ch, err := Load()
	if err != nil {
		return nil, err
	}
	opts := chartutil.ReleaseOptions{Name: ReleaseName, Namespace: "etjob-system", IsInstall: true}
	vals, err := chartutil.ToRenderValues(ch, values, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("chart values: %w", err)
	}
	out, err := engine.Render(ch, vals)
	if err != nil {
		return nil, err
	}
	var files []File
	for _, crd := range ch.CRDObjects() {
		files = append(files, File{Path: strings.TrimPrefix(crd.Filename, ch.Name()+"/"), Content: string(crd.File.Data)})
	}
	var templates []File
	prefix := ch.Name() + "/"
	for name, content := range out {
		if path.Base(name) == "NOTES.txt" || strings.HasPrefix(path.Base(name), "_") {
			continue
		}
		if strings.TrimSpace(stripComments(content)) == "" {
			continue
		}
		templates = append(templates, File{Path: strings.TrimPrefix(name, prefix), Content: content})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	sort.Slice(templates, func(i, j int) bool { return templates[i].Path < templates[j].Path })
	return append(files, templates...), nil
}

// Objects renders the chart and decodes every object, CRDs first.
func Objects(values map[string]any) ([]*unstructured.Unstructured, error) {
	files, err := Render(values)
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		o, err := Decode([]byte(f.Content))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
		objs = append(objs, o...)
	}
	return objs, nil
}

// Decode decodes a multi-document YAML stream, skipping empty documents,
// as unstructured objects do (integers stay int64).
func Decode(raw []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, err
		}
		if s := strings.TrimSpace(string(js)); s == "null" || s == "{}" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "#") || t == "---" {
			continue
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
