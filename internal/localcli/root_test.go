package localcli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/etjob/etjob/internal/cli"
)

// TestUnknownSubcommand: a word that names no command of a group fails,
// naming it (cobra printed the group's help and exited 0), and the group
// alone still prints its help.
func TestUnknownSubcommand(t *testing.T) {
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := NewRootCommand(cli.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out})
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	for _, tc := range []struct {
		args []string
		word string
	}{
		{[]string{"cluster", "delete"}, "delete"},
		{[]string{"cluster", "delete", "--dir", t.TempDir()}, "delete"},
		{[]string{"bogus"}, "bogus"},
	} {
		if _, err := run(tc.args...); err == nil || !strings.Contains(err.Error(), `unknown command "`+tc.word+`"`) {
			t.Errorf("etjob-local %s: err = %v, want an unknown command error naming %q", strings.Join(tc.args, " "), err, tc.word)
		}
	}
	out, err := run("cluster")
	if err != nil || !strings.Contains(out, "Available Commands:") {
		t.Errorf("etjob-local cluster: err = %v, out %q; want its help", err, out)
	}
}
