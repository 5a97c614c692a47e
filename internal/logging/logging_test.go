package logging

import (
	"bytes"
	"context"
	"flag"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestArenaHandler(t *testing.T) {
	var buf bytes.Buffer
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	h := NewArenaHandler(&buf, slog.LevelInfo, start)
	log := slog.New(h)
	for _, c := range []struct {
		level slog.Level
		msg   string
		after time.Duration
	}{{slog.LevelDebug, "hidden", 0}, {slog.LevelInfo, "submitted", 3 * time.Second}, {slog.LevelWarn, "careful", 12 * time.Second}, {slog.LevelError, "broken", 61 * time.Second}} {
		r := slog.NewRecord(start.Add(c.after), c.level, c.msg, 0)
		if h.Enabled(context.Background(), c.level) {
			if err := log.Handler().Handle(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		}
	}
	log.With("job", "digits").Info("done", "members", 4)
	got := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{"INFO[0003] submitted", "WARN[0012] careful", "ERRO[0061] broken"}
	if len(got) != 4 || strings.Join(got[:3], "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", buf.String(), strings.Join(want, "\n"))
	}
	if !strings.HasSuffix(got[3], "] done job=digits members=4") {
		t.Errorf("attributes: %q", got[3])
	}
}

func TestOptions(t *testing.T) {
	for _, s := range []string{"debug", "INFO", "warn", "warning", "error"} {
		if _, err := ParseLevel(s); err != nil {
			t.Errorf("ParseLevel(%q): %v", s, err)
		}
	}
	for args, wantErr := range map[string]string{
		"--log-level=loud":  "--log-level \"loud\"",
		"--log-format=yaml": "--log-format \"yaml\"",
		"--log-format=json": "",
		"-v":                "",
	} {
		var o Options
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse([]string{args}); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		l, err := o.New(&buf)
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Errorf("%s: error %v, want %s", args, err, wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", args, err)
		}
		l.Debug("dbg")
		if (args == "-v") != strings.Contains(buf.String(), "dbg") {
			t.Errorf("%s: debug line %q", args, buf.String())
		}
	}
}
