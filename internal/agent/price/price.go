// Package price holds the node agent's price sources: feeds of this node's
// current spot price, which the agent copies into the Node's
// etjob.dev/price-per-hour annotation, where etjob reads prices
// (etjobv1.NodePrice: the annotation before the label the node registered
// with). A job's spec.spot.maxPricePerHour is held against it, and
// status.cost bills at it.
//
// Clouds publish spot prices through their APIs, not their metadata
// services (AWS's DescribeSpotPriceHistory, Alibaba's DescribeSpotPriceHistory,
// Azure's Retail Prices API, GCP's Cloud Billing Catalog), with credentials
// and per-region pricing the agent does not have yet: only the local
// cluster's emulated market is implemented.
package price

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Source is a feed of this node's current price.
type Source interface {
	// Name names the feed in logs and Events.
	Name() string
	// Price is the node's current price; ok is false while the feed has
	// none (the node's label stands).
	Price(ctx context.Context) (p etjobv1.PricePerHour, ok bool, err error)
}

// Names of the sources New knows.
const (
	None  = "none"
	Local = "local"
)

// New returns the source called name: none (nil) or local, the local
// cluster's emulated market at baseURL (the node's metadata service).
func New(name, baseURL string) (Source, error) {
	switch name {
	case None, "":
		return nil, nil
	case Local:
		if baseURL == "" {
			return nil, fmt.Errorf("price source %q needs the metadata service's URL (--metadata-url)", name)
		}
		return &LocalMarket{BaseURL: baseURL}, nil
	}
	return nil, fmt.Errorf("price source %q: want %s or %s", name, None, Local)
}

// LocalMarketPath is where the local cluster's emulated market answers a
// node's price (its emulated cloud serves it).
const LocalMarketPath = "/etjob/spot-price"

// LocalMarket reads the local cluster's emulated market: GET
// {BaseURL}/etjob/spot-price answers the price as text, 404 while it has
// none.
type LocalMarket struct {
	BaseURL string
	Client  *http.Client
}

// Name implements Source.
func (m *LocalMarket) Name() string { return Local }

// Price implements Source.
func (m *LocalMarket) Price(ctx context.Context) (etjobv1.PricePerHour, bool, error) {
	c := m.Client
	if c == nil {
		c = &http.Client{Timeout: 2 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(m.BaseURL, "/")+LocalMarketPath, nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64))
	switch {
	case err != nil:
		return 0, false, err
	case resp.StatusCode == http.StatusNotFound:
		return 0, false, nil
	case resp.StatusCode != http.StatusOK:
		return 0, false, fmt.Errorf("GET %s: %s", req.URL, resp.Status)
	}
	p, err := etjobv1.ParsePricePerHour(strings.TrimSpace(string(body)))
	if err != nil {
		return 0, false, fmt.Errorf("GET %s: %w", req.URL, err)
	}
	return p, true, nil
}
