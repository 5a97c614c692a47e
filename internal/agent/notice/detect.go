package notice

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Options configures New and Detect.
type Options struct {
	// BaseURL overrides every provider's metadata URL (an emulator); empty
	// means each provider's own.
	BaseURL string
	// Client is the HTTP client; nil means each source's default.
	Client *http.Client
	// AzureVMName is this VM's name in Azure scheduled events; empty
	// accepts events for any VM.
	AzureVMName string
	// GCPWindow is the preemption window on GCP; zero means 30 s.
	GCPWindow time.Duration
}

// Providers lists the providers in auto-detection order.
var Providers = []string{ProviderAlibaba, ProviderAWS, ProviderGCP, ProviderAzure}

// New returns the source for provider ("alibaba", "aws", "gcp", "azure").
func New(provider string, o Options) (Source, error) {
	switch provider {
	case ProviderAlibaba:
		return &Alibaba{BaseURL: o.BaseURL, Client: o.Client}, nil
	case ProviderAWS:
		return &AWS{BaseURL: o.BaseURL, Client: o.Client}, nil
	case ProviderGCP:
		return &GCP{BaseURL: o.BaseURL, Client: o.Client, Window: o.GCPWindow}, nil
	case ProviderAzure:
		return &Azure{BaseURL: o.BaseURL, Client: o.Client, VMName: o.AzureVMName}, nil
	}
	return nil, fmt.Errorf("unknown provider %q (want one of %s)", provider, strings.Join(Providers, ", "))
}

// Detect probes every provider's metadata service at once, each for at most
// timeout, and returns the source of the first provider in Providers order
// that answers as that provider does; nil when none answers (not on a known
// cloud: only Kubernetes-side signals remain).
func Detect(ctx context.Context, o Options, timeout time.Duration) Source {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := o.Client
	if c == nil {
		c = &http.Client{Timeout: timeout}
	}
	results := make([]chan bool, len(Providers))
	for i, p := range Providers {
		results[i] = make(chan bool, 1)
		go func() { results[i] <- probe(ctx, c, p, o.BaseURL) }()
	}
	for i, p := range Providers {
		if <-results[i] {
			s, _ := New(p, o)
			return s
		}
	}
	return nil
}

// probe asks a path only provider p serves, with p's required header.
func probe(ctx context.Context, c *http.Client, p, base string) bool {
	var method, path, hk, hv string
	switch p {
	case ProviderAlibaba:
		method, path, base = http.MethodGet, "/latest/meta-data/instance-id", or(base, DefaultAlibabaURL)
	case ProviderAWS:
		method, path, base, hk, hv = http.MethodPut, awsTokenPath, or(base, DefaultAWSURL), awsTokenTTLHeader, "60"
	case ProviderGCP:
		method, path, base, hk, hv = http.MethodGet, "/computeMetadata/v1/instance/id", or(base, DefaultGCPURL), gcpFlavorHeader, gcpFlavor
	case ProviderAzure:
		method, path, base, hk, hv = http.MethodGet, "/metadata/instance?api-version=2021-02-01", or(base, DefaultAzureURL), azureHeader, "true"
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(base, "/")+path, nil)
	if err != nil {
		return false
	}
	if hk != "" {
		req.Header.Set(hk, hv)
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	if p == ProviderGCP && resp.Header.Get(gcpFlavorHeader) != gcpFlavor {
		return false
	}
	return resp.StatusCode == http.StatusOK
}
