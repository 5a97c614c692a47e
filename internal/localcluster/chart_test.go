package localcluster

import (
	"strings"
	"testing"

	"github.com/etjob/etjob/internal/chart"
	"github.com/etjob/etjob/internal/testutil"
)

// TestChartDefaults: the images, namespaces and command the local cluster
// maps and waits for are the ones the chart renders with the local values,
// and the image table maps exactly those images to this build's binaries.
func TestChartDefaults(t *testing.T) {
	c := &Cluster{ControllerArgs: []string{"--record-decisions=/tmp/d.jsonl"}}
	objs, err := chart.Objects(c.ChartValues())
	if err != nil {
		t.Fatal(err)
	}
	b := Binaries{Controller: "/build/etjob-controller", Agent: "/build/etjob-agent", Node: "/build/etjob-node"}
	images := componentImages(b)
	for _, w := range []struct{ kind, name, namespace, image, binary string }{
		{"Deployment", "etjob-controller", ControllerNamespace, ControllerImage, b.Controller},
		{"DaemonSet", "etjob-agent", AgentNamespace, AgentImage, b.Agent},
	} {
		o := testutil.Find(t, objs, w.kind, w.name)
		if o.GetNamespace() != w.namespace {
			t.Errorf("%s %s is in %q, the local cluster waits in %q", w.kind, w.name, o.GetNamespace(), w.namespace)
		}
		ctr := testutil.Container(t, o)
		img := ctr["image"].(string)
		if !strings.HasPrefix(img, w.image+":") {
			t.Errorf("%s %s runs %q, the local cluster maps %s:*", w.kind, w.name, img, w.image)
		}
		im, ok := images.Lookup(img)
		if !ok || !strings.HasPrefix(im.Env["PATH"], "/build:") {
			t.Errorf("image %s maps to %+v, want PATH starting with the binaries' directory", img, im)
		}
		cmd := ctr["command"].([]any)[0].(string)
		if "/build/"+cmd != w.binary {
			t.Errorf("%s %s runs %q, not the binary %s", w.kind, w.name, cmd, w.binary)
		}
	}
	var joined []string
	for _, a := range testutil.Container(t, testutil.Find(t, objs, "Deployment", "etjob-controller"))["args"].([]any) {
		joined = append(joined, a.(string))
	}
	for _, want := range []string{"--leader-election-namespace=" + ControllerNamespace, "--record-decisions=/tmp/d.jsonl",
		"--price-table=" + ControllerNamespace + "/" + PriceTable} {
		if !strings.Contains(strings.Join(joined, " "), want) {
			t.Errorf("controller args %v lack %q", joined, want)
		}
	}
}
