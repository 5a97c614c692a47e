package notice

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// DefaultAlibabaURL is the ECS instance metadata service.
const DefaultAlibabaURL = "http://100.100.100.200"

// alibabaTerminationPath answers 404 until the spot instance is to be
// released, then the release time in UTC (about 5 minutes ahead).
const alibabaTerminationPath = "/latest/meta-data/instance/spot/termination-time"

// Alibaba reads the ECS spot termination time.
type Alibaba struct {
	// BaseURL is the metadata service; empty means DefaultAlibabaURL.
	BaseURL string
	// Client is the HTTP client; nil means one with a 2 s timeout.
	Client *http.Client
}

// Provider returns "alibaba".
func (a *Alibaba) Provider() string { return ProviderAlibaba }

// Poll reads instance/spot/termination-time once.
func (a *Alibaba) Poll(ctx context.Context) (Notice, error) {
	base := strings.TrimSuffix(or(a.BaseURL, DefaultAlibabaURL), "/")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+alibabaTerminationPath, nil)
	if err != nil {
		return Notice{}, err
	}
	body, _, err := do(httpClient(a.Client), req)
	if errors.Is(err, errNotFound) {
		return Notice{Source: ProviderAlibaba}, nil
	}
	if err != nil {
		return Notice{}, err
	}
	return parseAlibabaTermination(body)
}

// parseAlibabaTermination reads the body of a 200 answer from
// instance/spot/termination-time: a reclaim at that UTC time. It is pure so
// that a fuzzer can feed it any bytes (fuzz_test.go).
func parseAlibabaTermination(body []byte) (Notice, error) {
	s := strings.TrimSpace(string(body))
	t, err := parseISO8601(s)
	if err != nil {
		return Notice{}, fmt.Errorf("alibaba termination-time %q: %w", s, err)
	}
	return Notice{Kind: Reclaim, Deadline: t, Source: ProviderAlibaba, Detail: "spot termination-time " + s}, nil
}

// parseISO8601 parses the UTC times the metadata services print: RFC 3339,
// optionally without seconds (ECS documents 2015-01-05T18:02Z as well as
// 2015-01-05T18:02:00Z).
func parseISO8601(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04Z07:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("not an ISO 8601 UTC time (want e.g. 2015-01-05T18:02:00Z)")
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
