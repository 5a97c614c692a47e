// Package notice reads reclamation notices from the clouds' instance metadata
// services (Alibaba ECS, AWS IMDSv2, GCP, Azure Scheduled Events), one Source
// per provider, and debounces their answers into a stable Notice stream.
//
// The base URL of every source is a field so that tests and the local cluster
// point it at an emulator (package internal/emucloud).
package notice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"
)

// Provider names, as they appear in Notice.Source and on the --provider flag.
const (
	ProviderAlibaba = "alibaba"
	ProviderAWS     = "aws"
	ProviderGCP     = "gcp"
	ProviderAzure   = "azure"
)

// Kind says what a notice asks of the node.
type Kind int

const (
	// None means no notice: the node stays.
	None Kind = iota
	// EarlyWarning means the node may go soon (AWS rebalance recommendation,
	// GCP or Azure maintenance): checkpoint now, do not leave.
	EarlyWarning
	// Reclaim means the node goes at Deadline: leave before it.
	Reclaim
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case None:
		return "None"
	case EarlyWarning:
		return "EarlyWarning"
	case Reclaim:
		return "Reclaim"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Notice is one reading of a provider's notice.
type Notice struct {
	// Kind is None, EarlyWarning or Reclaim.
	Kind Kind
	// Deadline is when the node goes; zero unless Kind is Reclaim.
	Deadline time.Time
	// Source is the provider ("alibaba", "aws", "gcp", "azure").
	Source string
	// Detail is the provider's own words (action, event type, event id).
	Detail string
	// EventID identifies the provider event to acknowledge (Azure); empty
	// for providers without acknowledgement.
	EventID string
}

// Equal reports whether two notices are the same reading.
func (n Notice) Equal(o Notice) bool {
	return n.Kind == o.Kind && n.Deadline.Equal(o.Deadline) && n.Source == o.Source &&
		n.Detail == o.Detail && n.EventID == o.EventID
}

// Source reads one provider's current notice.
type Source interface {
	// Provider returns the provider name.
	Provider() string
	// Poll reads the metadata service once. An error means the answer is
	// unknown (unreachable, 5xx, malformed), never "no notice".
	Poll(ctx context.Context) (Notice, error)
}

// Acker is implemented by sources whose provider wants to be told that the
// node is ready to go (Azure StartRequests).
type Acker interface {
	// Ack acknowledges the provider event eventID.
	Ack(ctx context.Context, eventID string) error
}

// defaultTimeout bounds one metadata request: the services answer in
// milliseconds, and a hung request must not hold the poll loop.
const defaultTimeout = 2 * time.Second

func httpClient(c *http.Client) *http.Client {
	if c != nil {
		return c
	}
	return &http.Client{Timeout: defaultTimeout}
}

// errNotFound is a 404: the documented "no notice" answer.
var errNotFound = errors.New("not found")

// do performs req and returns the body of a 200 answer, errNotFound for a
// 404, and an error naming the URL and status for anything else.
func do(c *http.Client, req *http.Request) ([]byte, http.Header, error) {
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: reading body: %w", req.Method, req.URL, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, resp.Header, errNotFound
	case resp.StatusCode/100 != 2:
		return nil, resp.Header, &StatusError{Method: req.Method, URL: req.URL.String(), Code: resp.StatusCode}
	}
	return body, resp.Header, nil
}

// StatusError is an unexpected HTTP status from a metadata service.
type StatusError struct {
	Method, URL string
	Code        int
}

// Error names the request and the status.
func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: unexpected status %d %s", e.Method, e.URL, e.Code, http.StatusText(e.Code))
}

// Debouncer turns raw readings into reported notices: a changed reading is
// reported only after Confirm consecutive identical readings (metadata
// answers flap during a reclaim), an error neither raises nor cancels a
// notice, and a deadline in the past is clamped to the time it is reported.
type Debouncer struct {
	// Confirm is how many consecutive identical readings a change needs;
	// values below 1 mean 1.
	Confirm int
	// Log receives each distinct error once; nil discards.
	Log *slog.Logger

	reported  Notice // what was reported, deadline clamped
	raw       Notice // the reading behind reported
	candidate Notice
	count     int
	settled   bool
	lastErr   string
}

// Observe feeds one reading taken at now and returns the reported notice and
// whether it changed with this reading.
func (d *Debouncer) Observe(n Notice, err error, now time.Time) (Notice, bool) {
	if err != nil {
		if msg := err.Error(); msg != d.lastErr {
			d.lastErr = msg
			if d.Log != nil {
				d.Log.Warn("reading the metadata service failed; keeping the last notice", "err", err)
			}
		}
		d.count = 0
		return d.reported, false
	}
	if d.lastErr != "" && d.Log != nil {
		d.Log.Info("metadata service answers again")
	}
	d.lastErr = ""
	if n.Kind != Reclaim {
		n.Deadline = time.Time{}
	}
	if d.count > 0 && n.Equal(d.candidate) {
		d.count++
	} else {
		d.candidate, d.count = n, 1
	}
	confirm := max(d.Confirm, 1)
	if d.count < confirm {
		return d.reported, false
	}
	d.settled = true
	if n.Equal(d.raw) {
		return d.reported, false
	}
	d.raw = n
	if n.Kind == Reclaim && d.reported.Kind == Reclaim && n.Deadline.After(d.reported.Deadline) {
		// A node's termination time does not move later: a reading that
		// names a later one while a reclaim is reported (a second notice
		// for a node already under notice) keeps the reported notice, as
		// the cloud may still take the node at the first deadline (found
		// by TestHorovodSpotStory: a leaver republished on the later
		// deadline was lost at the first inside Horovod's reset). Only a
		// withdrawal (None) or an earlier deadline replaces it.
		return d.reported, false
	}
	if n.Kind == Reclaim && n.Deadline.Before(now) {
		n.Deadline = now
	}
	d.reported = n
	return n, true
}

// Settled reports whether a reading has been confirmed since the start, so
// that the current notice (possibly None) is known rather than assumed.
func (d *Debouncer) Settled() bool { return d.settled }

// Confirming reports whether a reading that differs from what is reported
// waits for its confirmation.
func (d *Debouncer) Confirming() bool {
	return d.count > 0 && d.count < max(d.Confirm, 1) && (!d.settled || !d.candidate.Equal(d.raw))
}

// ConfirmInterval is the time between the readings that confirm a change: a
// new notice is believed ~100 ms after it was first read, not a whole poll
// interval later (issue #4's notice → check_alive() ≤ 1 s), and a flapping or
// malformed answer still needs Confirm identical readings in a row.
const ConfirmInterval = 100 * time.Millisecond

// Watch polls src every interval (every ConfirmInterval while a change is
// being confirmed) until ctx ends and calls onChange with each newly reported
// notice, and once with the first settled notice even if it is None (the
// caller then knows the answer).
func Watch(ctx context.Context, src Source, interval time.Duration, d *Debouncer, now func() time.Time, onChange func(Notice)) {
	if now == nil {
		now = time.Now
	}
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		n, err := src.Poll(ctx)
		if ctx.Err() != nil {
			return
		}
		wasSettled := d.Settled()
		if got, changed := d.Observe(n, err, now()); changed || (!wasSettled && d.Settled()) {
			onChange(got)
		}
		wait := interval
		if d.Confirming() {
			wait = min(interval, ConfirmInterval)
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
