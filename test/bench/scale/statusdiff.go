package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"

	toolscache "k8s.io/client-go/tools/cache"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// statusTracer records the status of one job at every update its informer
// delivers, to say why the controller wrote each status of a scale event.
// It rides on the benchmark's ElasticJob informer: no extra watch.
type statusTracer struct {
	mu   sync.Mutex
	name string
	seen []etjobv1.ElasticJobStatus
}

// handler returns the informer event handler that feeds the tracer.
func (t *statusTracer) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{UpdateFunc: func(_, obj any) {
		j, ok := obj.(*etjobv1.ElasticJob)
		if !ok {
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if j.Name == t.name && j.Namespace == namespace {
			t.seen = append(t.seen, *j.Status.DeepCopy())
		}
	}}
}

// start traces the job named name.
func (t *statusTracer) start(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.name, t.seen = name, nil
}

// stop ends the trace and returns one line per status change since before:
// the fields that changed, as JSON paths with old → new values.
func (t *statusTracer) stop(before etjobv1.ElasticJobStatus) []string {
	t.mu.Lock()
	seen := t.seen
	t.name, t.seen = "", nil
	t.mu.Unlock()
	var out []string
	prev := before
	for _, st := range seen {
		var diffs []string
		jsonDiff("", toJSON(prev), toJSON(st), &diffs)
		if len(diffs) > 0 {
			out = append(out, strings.Join(diffs, "; "))
		}
		prev = st
	}
	return out
}

func toJSON(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// jsonDiff appends "path: old → new" for every leaf that differs between a
// and b (decoded JSON), descending into objects and arrays.
func jsonDiff(path string, a, b any, out *[]string) {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		keys := map[string]bool{}
		for k := range am {
			keys[k] = true
		}
		for k := range bm {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			jsonDiff(path+"."+k, am[k], bm[k], out)
		}
		return
	}
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok && bok {
		for i := range max(len(as), len(bs)) {
			var x, y any
			if i < len(as) {
				x = as[i]
			}
			if i < len(bs) {
				y = bs[i]
			}
			jsonDiff(fmt.Sprintf("%s[%d]", path, i), x, y, out)
		}
		return
	}
	if !reflect.DeepEqual(a, b) {
		*out = append(*out, fmt.Sprintf("%s: %s → %s", strings.TrimPrefix(path, "."), short(a), short(b)))
	}
}

// short prints a JSON value in at most 60 characters.
func short(v any) string {
	if v == nil {
		return "∅"
	}
	b, _ := json.Marshal(v)
	if s := string(b); len(s) > 60 {
		return s[:57] + "..."
	}
	return string(b)
}
