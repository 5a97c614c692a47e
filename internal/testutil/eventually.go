package testutil

import (
	"fmt"
	"testing"
	"time"
)

// The tests' waits, shared: Timeout for what a controller or an agent does
// within seconds on a real API server, LongTimeout for what training on the
// local cluster does within minutes.
const (
	Timeout     = 30 * time.Second
	LongTimeout = 5 * time.Minute
	// Poll is how often Eventually asks.
	Poll = 100 * time.Millisecond
)

// Condition is what Eventually waits for: a func() bool, a func() error (nil
// is done; the last error is reported) or a func() (bool, string) (the last
// string is reported).
type Condition interface {
	func() bool | func() error | func() (bool, string)
}

// Eventually calls cond every Poll until it holds, and fails t after timeout
// naming what it waited for and the condition's last word. It is the tests'
// one wait helper.
func Eventually[C Condition](t testing.TB, timeout time.Duration, what string, cond C) {
	t.Helper()
	EventuallyEvery(t, Poll, timeout, what, cond)
}

// EventuallyEvery is Eventually asking every interval (the end-to-end
// stories ask the API server and read logs, every 500 ms).
func EventuallyEvery[C Condition](t testing.TB, interval, timeout time.Duration, what string, cond C) {
	t.Helper()
	check := asCheck(cond)
	deadline := time.Now().Add(timeout)
	for {
		ok, last := check()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if last != "" {
				t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, last)
			}
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
}

func asCheck[C Condition](cond C) func() (bool, string) {
	switch c := any(cond).(type) {
	case func() bool:
		return func() (bool, string) { return c(), "" }
	case func() error:
		return func() (bool, string) {
			if err := c(); err != nil {
				return false, err.Error()
			}
			return true, ""
		}
	case func() (bool, string):
		return c
	}
	panic(fmt.Sprintf("testutil.Eventually: a condition of type %T", cond)) // the constraint admits no other

}
