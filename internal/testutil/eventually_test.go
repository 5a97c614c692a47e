package testutil

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records Fatalf instead of stopping the test.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
	for _, a := range args {
		r.failed += " " + toString(a)
	}
	panic(r)
}

func toString(a any) string {
	switch v := a.(type) {
	case string:
		return v
	case time.Duration:
		return v.String()
	}
	return ""
}

func run(f func(tb testing.TB)) (failed string) {
	r := &recorder{}
	defer func() {
		if p := recover(); p != nil && p != r {
			panic(p)
		}
		failed = r.failed
	}()
	f(r)
	return ""
}

func TestEventually(t *testing.T) {
	n := 0
	if got := run(func(tb testing.TB) {
		Eventually(tb, time.Second, "the third call", func() bool { n++; return n == 3 })
	}); got != "" || n != 3 {
		t.Errorf("a bool condition: failed %q after %d calls", got, n)
	}
	got := run(func(tb testing.TB) {
		Eventually(tb, 250*time.Millisecond, "the pod", func() error { return errors.New("pod p is Pending") })
	})
	if !strings.Contains(got, "the pod") || !strings.Contains(got, "pod p is Pending") {
		t.Errorf("an error condition's failure says %q, not what it waited for and the last error", got)
	}
	got = run(func(tb testing.TB) {
		EventuallyEvery(tb, 50*time.Millisecond, 200*time.Millisecond, "the job", func() (bool, string) { return false, "Running 3/4" })
	})
	if !strings.Contains(got, "the job") || !strings.Contains(got, "Running 3/4") {
		t.Errorf("a (bool, string) condition's failure says %q", got)
	}
}
