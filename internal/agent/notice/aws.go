package notice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultAWSURL is the EC2 instance metadata service.
const DefaultAWSURL = "http://169.254.169.254"

// IMDSv2 paths and headers.
const (
	awsTokenPath       = "/latest/api/token"
	awsActionPath      = "/latest/meta-data/spot/instance-action"
	awsRebalancePath   = "/latest/meta-data/events/recommendations/rebalance"
	awsTokenTTLHeader  = "X-aws-ec2-metadata-token-ttl-seconds"
	awsTokenHeader     = "X-aws-ec2-metadata-token"
	awsDefaultTokenTTL = 6 * time.Hour
)

// AWS reads the EC2 spot instance action (2-minute notice) and the rebalance
// recommendation (an early warning) through IMDSv2.
type AWS struct {
	// BaseURL is the metadata service; empty means DefaultAWSURL.
	BaseURL string
	// Client is the HTTP client; nil means one with a 2 s timeout.
	Client *http.Client
	// TokenTTL is the session token lifetime asked for; zero means 6 h, the
	// IMDSv2 maximum. The token is refreshed at 80% of it.
	TokenTTL time.Duration
	// Now is the clock for token expiry; nil means time.Now.
	Now func() time.Time

	mu       sync.Mutex
	token    string
	tokenExp time.Time
}

// Provider returns "aws".
func (a *AWS) Provider() string { return ProviderAWS }

type awsInstanceAction struct {
	Action string `json:"action"`
	Time   string `json:"time"`
}

type awsRebalance struct {
	NoticeTime string `json:"noticeTime"`
}

// Poll reads spot/instance-action, then the rebalance recommendation.
func (a *AWS) Poll(ctx context.Context) (Notice, error) {
	body, err := a.get(ctx, awsActionPath)
	switch {
	case err == nil:
		return parseAWSInstanceAction(body)
	case !errors.Is(err, errNotFound):
		return Notice{}, err
	}
	body, err = a.get(ctx, awsRebalancePath)
	switch {
	case errors.Is(err, errNotFound):
		return Notice{Source: ProviderAWS}, nil
	case err != nil:
		return Notice{}, err
	}
	return parseAWSRebalance(body)
}

// parseAWSInstanceAction reads the body of a 200 answer from
// spot/instance-action: a reclaim at its time. Pure, for the fuzzer.
func parseAWSInstanceAction(body []byte) (Notice, error) {
	var act awsInstanceAction
	if err := json.Unmarshal(body, &act); err != nil {
		return Notice{}, fmt.Errorf("aws spot/instance-action %q: %w", body, err)
	}
	switch act.Action {
	case "terminate", "stop", "hibernate":
	default:
		return Notice{}, fmt.Errorf("aws spot/instance-action: unknown action %q (want terminate, stop or hibernate)", act.Action)
	}
	t, err := parseISO8601(act.Time)
	if err != nil {
		return Notice{}, fmt.Errorf("aws spot/instance-action time %q: %w", act.Time, err)
	}
	return Notice{Kind: Reclaim, Deadline: t, Source: ProviderAWS, Detail: "spot instance-action " + act.Action}, nil
}

// parseAWSRebalance reads the body of a 200 answer from
// events/recommendations/rebalance: an early warning. Pure, for the fuzzer.
func parseAWSRebalance(body []byte) (Notice, error) {
	var rb awsRebalance
	if err := json.Unmarshal(body, &rb); err != nil {
		return Notice{}, fmt.Errorf("aws rebalance recommendation %q: %w", body, err)
	}
	if _, err := parseISO8601(rb.NoticeTime); err != nil {
		return Notice{}, fmt.Errorf("aws rebalance recommendation noticeTime %q: %w", rb.NoticeTime, err)
	}
	return Notice{Kind: EarlyWarning, Source: ProviderAWS, Detail: "rebalance recommendation at " + rb.NoticeTime}, nil
}

// get reads path with the session token, fetching a new token when the
// cached one is near expiry or the service answers 401 (it was revoked or
// the service restarted).
func (a *AWS) get(ctx context.Context, path string) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		tok, err := a.sessionToken(ctx, attempt > 0)
		if err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base()+path, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set(awsTokenHeader, tok)
		body, _, err := do(httpClient(a.Client), req)
		var se *StatusError
		if errors.As(err, &se) && se.Code == http.StatusUnauthorized && attempt == 0 {
			continue
		}
		return body, err
	}
}

func (a *AWS) base() string { return strings.TrimSuffix(or(a.BaseURL, DefaultAWSURL), "/") }

func (a *AWS) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *AWS) sessionToken(ctx context.Context, force bool) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !force && a.token != "" && a.now().Before(a.tokenExp) {
		return a.token, nil
	}
	ttl := a.TokenTTL
	if ttl <= 0 {
		ttl = awsDefaultTokenTTL
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, a.base()+awsTokenPath, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set(awsTokenTTLHeader, strconv.Itoa(int(ttl/time.Second)))
	body, _, err := do(httpClient(a.Client), req)
	if err != nil {
		a.token = ""
		return "", fmt.Errorf("aws IMDSv2 token: %w", err)
	}
	tok := strings.TrimSpace(string(body))
	if tok == "" {
		return "", fmt.Errorf("aws IMDSv2 token: empty answer from PUT %s", awsTokenPath)
	}
	a.token, a.tokenExp = tok, a.now().Add(ttl*8/10)
	return tok, nil
}
