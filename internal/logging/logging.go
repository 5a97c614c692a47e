// Package logging is etjob's one logger, log/slog, in every binary. The
// controller hands it to controller-runtime (through logr) and to client-go
// (klog), the process node to virtual-kubelet, the agent uses it as it is,
// and the CLI prints Arena's "INFO[0003] msg" lines with ArenaHandler.
package logging

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// ParseLevel reads debug, info, warn (or warning) or error, in any case.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("%q: must be debug, info, warn or error", s)
}

// Options are the log flags of the component binaries.
type Options struct {
	// Level is --log-level; -v means debug.
	Level string
	// Format is --log-format: text (logfmt) or json.
	Format  string
	verbose bool
}

// AddFlags registers --log-level, --log-format and -v on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Level, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&o.Format, "log-format", "text", "log format: text (logfmt) or json")
	fs.BoolVar(&o.verbose, "v", false, "log debug messages (--log-level=debug)")
}

// New returns the logger the options describe, writing to w, or an error that
// names the bad flag.
func (o Options) New(w io.Writer) (*slog.Logger, error) {
	level, err := ParseLevel(o.Level)
	if err != nil {
		return nil, fmt.Errorf("--log-level %w", err)
	}
	if o.verbose {
		level = slog.LevelDebug
	}
	ho := &slog.HandlerOptions{Level: level}
	switch o.Format {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return nil, fmt.Errorf("--log-format %q: must be text or json", o.Format)
}

// Install makes l the logger of the libraries the controller runs on:
// controller-runtime's logr and client-go's klog, and slog's default.
func Install(l *slog.Logger) {
	slog.SetDefault(l)
	ctrllog.SetLogger(logr.FromSlogHandler(l.Handler()))
	klog.SetSlogLogger(l)
}

// ArenaHandler prints records as Arena (logrus) does: "INFO[0003] msg", the
// seconds since start, then the attributes as key=value. The CLI writes them
// to stderr, so that stdout stays a clean object (-o yaml) or table.
type ArenaHandler struct {
	w     io.Writer
	mu    *sync.Mutex
	level slog.Leveler
	start time.Time
	attrs string
}

// NewArenaHandler returns a handler writing to w records at level or above,
// timed from start.
func NewArenaHandler(w io.Writer, level slog.Leveler, start time.Time) *ArenaHandler {
	return &ArenaHandler{w: w, mu: &sync.Mutex{}, level: level, start: start}
}

// Enabled reports whether level is printed.
func (h *ArenaHandler) Enabled(_ context.Context, level slog.Level) bool {
	return level >= h.level.Level()
}

// Handle prints one record.
func (h *ArenaHandler) Handle(_ context.Context, r slog.Record) error {
	tag := "INFO"
	switch {
	case r.Level >= slog.LevelError:
		tag = "ERRO"
	case r.Level >= slog.LevelWarn:
		tag = "WARN"
	case r.Level < slog.LevelInfo:
		tag = "DEBU"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s[%04d] %s", tag, int(r.Time.Sub(h.start).Seconds()), r.Message)
	b.WriteString(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	b.WriteByte('\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

// WithAttrs returns a handler that prints attrs on every record.
func (h *ArenaHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	for _, a := range attrs {
		c.attrs += " " + a.String()
	}
	return &c
}

// WithGroup is WithAttrs' grouping: the CLI's lines have none, so groups
// are ignored.
func (h *ArenaHandler) WithGroup(string) slog.Handler { return h }
