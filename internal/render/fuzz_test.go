package render_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/core"
	"github.com/etjob/etjob/internal/render"
	. "github.com/etjob/etjob/internal/testutil"
)

// FuzzConfigMap renders a membership of any entries (one per line of the
// input) into the ConfigMap that discover_hosts.sh and MPI read. Properties:
// no panic; every `hosts` line is an entry core.ParseHost accepts; every
// `hostfile` line is `host slots=N`; and both list exactly the well-formed
// entries, in order.
//
//	go test -run '^$' -fuzz '^FuzzConfigMap$' -fuzztime 60s ./internal/render
func FuzzConfigMap(f *testing.F) {
	f.Add("h-worker-0:2\nh-worker-3:2")
	f.Add("elastic-training-worker-0:1\nelastic-training-worker-1:1\nelastic-training-worker-3:1")
	f.Add("digits-worker-0:8")
	f.Add("")
	job := MakeElasticJob("h", "ml").Framework(etjobv1.FrameworkHorovod).Obj()
	f.Fuzz(func(t *testing.T, text string) {
		var entries []string
		if text != "" {
			entries = strings.Split(text, "\n")
		}
		cm := render.ConfigMap(job, etjobv1.MembershipStatus{Generation: 1, Hosts: entries})
		type member struct {
			host  string
			slots int32
		}
		var want []member
		for _, e := range entries {
			if h, s, ok := core.ParseHost(e); ok {
				want = append(want, member{h, s})
			}
		}
		var fromHosts, fromHostfile []member
		for line := range strings.Lines(cm.Data["hosts"]) {
			h, s, ok := core.ParseHost(strings.TrimSuffix(line, "\n"))
			if !ok {
				t.Fatalf("hosts line %q is not host:slots", line)
			}
			fromHosts = append(fromHosts, member{h, s})
		}
		for line := range strings.Lines(cm.Data["hostfile"]) {
			fields := strings.Fields(line)
			if len(fields) != 2 || !strings.HasPrefix(fields[1], "slots=") {
				t.Fatalf("hostfile line %q is not `host slots=N`", line)
			}
			n, err := strconv.Atoi(strings.TrimPrefix(fields[1], "slots="))
			if err != nil || n < 1 {
				t.Fatalf("hostfile line %q: slots are not a positive number", line)
			}
			fromHostfile = append(fromHostfile, member{fields[0], int32(n)})
		}
		if !slices.Equal(fromHosts, want) || !slices.Equal(fromHostfile, want) {
			t.Fatalf("entries %q: hosts %q and hostfile %q, want the members %v", entries, cm.Data["hosts"], cm.Data["hostfile"], want)
		}
	})
}
