package processnode

import (
	"strings"
	"testing"
)

// TestMainFlags: a capacity flag that is no positive quantity is refused,
// naming the flag, before anything starts.
func TestMainFlags(t *testing.T) {
	base := []string{"--node-name=n", "--node-ip=127.0.9.1", "--work-dir=" + t.TempDir()}
	for _, c := range []struct{ arg, want string }{
		{"--cpus=many", `--cpus "many"`},
		{"--memory=-1Gi", `--memory "-1Gi"`},
		{"--cpus=0", `--cpus "0"`},
	} {
		err := runNode(append(base, c.arg))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.arg, err, c.want)
		}
	}
}
