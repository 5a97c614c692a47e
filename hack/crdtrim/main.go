// Command crdtrim removes the descriptions inside the embedded pod templates of
// a generated CRD, keeping the descriptions of etjob's own fields.
//
// Two full PodTemplateSpecs make the CRD ~1.3 MB, close to etcd's 1.5 MB object
// limit; kubectl explain on pod fields is documented by the Pod API itself.
//
// Usage: go run ./hack/crdtrim FILE...
package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// templates are the spec properties whose subtrees lose their descriptions.
var templates = []string{"workerTemplate", "launcherTemplate"}

func main() {
	for _, path := range os.Args[1:] {
		if err := trim(path); err != nil {
			fmt.Fprintf(os.Stderr, "crdtrim: %s: %v\n", path, err)
			os.Exit(1)
		}
	}
}

func trim(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var crd map[string]any
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		return err
	}
	versions, _ := dig(crd, "spec", "versions").([]any)
	for _, v := range versions {
		props, _ := dig(v, "schema", "openAPIV3Schema", "properties", "spec", "properties").(map[string]any)
		for _, t := range templates {
			if tmpl, ok := props[t].(map[string]any); ok {
				for k, sub := range tmpl {
					if k != "description" {
						stripDescriptions(sub)
					}
				}
			}
		}
	}
	out, err := yaml.Marshal(crd)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte("---\n"), out...), 0o644)
}

func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func stripDescriptions(v any) {
	switch t := v.(type) {
	case map[string]any:
		delete(t, "description")
		for _, sub := range t {
			stripDescriptions(sub)
		}
	case []any:
		for _, sub := range t {
			stripDescriptions(sub)
		}
	}
}
