package notice

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultGCPURL is the Compute Engine metadata server.
const DefaultGCPURL = "http://metadata.google.internal"

// GCP metadata paths and headers.
const (
	gcpPreemptedPath   = "/computeMetadata/v1/instance/preempted"
	gcpMaintenancePath = "/computeMetadata/v1/instance/maintenance-event"
	gcpFlavorHeader    = "Metadata-Flavor"
	gcpFlavor          = "Google"
	// DefaultGCPWindow is the time from a preemption notice to the stop:
	// Compute Engine gives 30 s (GKE pods get about 15 s of it).
	DefaultGCPWindow = 30 * time.Second
)

// GCP reads instance/preempted (a reclaim, with no deadline of its own) and
// instance/maintenance-event (an early warning).
type GCP struct {
	// BaseURL is the metadata server; empty means DefaultGCPURL.
	BaseURL string
	// Client is the HTTP client; nil means one with a 2 s timeout (plus
	// WaitTimeout when long-polling).
	Client *http.Client
	// Window is the time from the first TRUE to the stop; zero means 30 s.
	Window time.Duration
	// WaitTimeout, when positive, long-polls instance/preempted with
	// ?wait_for_change=true for at most this long, so a change is seen the
	// moment it happens rather than at the next poll.
	WaitTimeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu        sync.Mutex
	firstSeen time.Time
	etag      string
}

// Provider returns "gcp".
func (g *GCP) Provider() string { return ProviderGCP }

// Poll reads instance/preempted, then instance/maintenance-event.
func (g *GCP) Poll(ctx context.Context) (Notice, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	q := url.Values{}
	// The first read is plain: it learns the current value and its ETag;
	// later reads wait for a value other than that one.
	if g.WaitTimeout > 0 && g.etag != "" {
		q.Set("wait_for_change", "true")
		q.Set("timeout_sec", strconv.Itoa(max(1, int(g.WaitTimeout/time.Second))))
		q.Set("last_etag", g.etag)
	}
	body, hdr, err := g.get(ctx, gcpPreemptedPath, q)
	if err != nil {
		return Notice{}, err
	}
	if hdr != nil && hdr.Get("ETag") != "" {
		g.etag = hdr.Get("ETag")
	}
	preempted, err := parseGCPPreempted(body)
	if err != nil {
		return Notice{}, err
	}
	if preempted {
		if g.firstSeen.IsZero() {
			g.firstSeen = g.now()
		}
		window := g.Window
		if window <= 0 {
			window = DefaultGCPWindow
		}
		return Notice{Kind: Reclaim, Deadline: g.firstSeen.Add(window), Source: ProviderGCP, Detail: "instance/preempted TRUE"}, nil
	}
	g.firstSeen = time.Time{}
	body, _, err = g.get(ctx, gcpMaintenancePath, nil)
	if err != nil {
		return Notice{}, err
	}
	return parseGCPMaintenance(body)
}

// parseGCPPreempted reads instance/preempted: TRUE or FALSE, nothing else.
// Pure, for the fuzzer; the deadline is the caller's (GCP gives none).
func parseGCPPreempted(body []byte) (bool, error) {
	switch v := strings.TrimSpace(string(body)); v {
	case "TRUE":
		return true, nil
	case "FALSE":
		return false, nil
	default:
		return false, fmt.Errorf("gcp instance/preempted: got %q, want TRUE or FALSE", v)
	}
}

// parseGCPMaintenance reads instance/maintenance-event: NONE, or an early
// warning for either kind of host maintenance. Pure, for the fuzzer.
func parseGCPMaintenance(body []byte) (Notice, error) {
	switch v := strings.TrimSpace(string(body)); v {
	case "NONE":
		return Notice{Source: ProviderGCP}, nil
	case "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE":
		return Notice{Kind: EarlyWarning, Source: ProviderGCP, Detail: "maintenance-event " + v}, nil
	default:
		return Notice{}, fmt.Errorf("gcp instance/maintenance-event: got %q, want NONE, MIGRATE_ON_HOST_MAINTENANCE or TERMINATE_ON_HOST_MAINTENANCE", v)
	}
}

func (g *GCP) get(ctx context.Context, path string, q url.Values) ([]byte, http.Header, error) {
	u := strings.TrimSuffix(or(g.BaseURL, DefaultGCPURL), "/") + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set(gcpFlavorHeader, gcpFlavor)
	c := g.Client
	if c == nil {
		c = &http.Client{Timeout: defaultTimeout + g.WaitTimeout}
	}
	body, hdr, err := do(c, req)
	if errors.Is(err, errNotFound) {
		// Both paths always exist on a real metadata server.
		return nil, nil, fmt.Errorf("gcp %s: 404 Not Found", path)
	}
	return body, hdr, err
}

func (g *GCP) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}
