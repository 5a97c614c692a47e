package notice

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// DefaultAzureURL is the Azure Instance Metadata Service.
const DefaultAzureURL = "http://169.254.169.254"

// Scheduled Events and instance metadata paths, and the header.
const (
	azureEventsPath   = "/metadata/scheduledevents?api-version=2020-07-01"
	azureInstancePath = "/metadata/instance?api-version=2021-02-01"
	azureHeader       = "Metadata"
)

// Azure reads Scheduled Events: Preempt (spot eviction) and Terminate are
// reclaims at NotBefore; Freeze, Reboot and Redeploy are early warnings.
// An event that disappears is withdrawn, and the notice with it.
type Azure struct {
	// BaseURL is the metadata service; empty means DefaultAzureURL.
	BaseURL string
	// Client is the HTTP client; nil means one with a 2 s timeout.
	Client *http.Client
	// VMName is this VM's name in the events' Resources; empty reads it from
	// the instance metadata (compute.name) at the first Poll. Events of other
	// VMs are never taken: one VM's eviction in a scale set is not this
	// node's notice, and acknowledging it would hurry another VM's.
	VMName string
}

// Provider returns "azure".
func (a *Azure) Provider() string { return ProviderAzure }

// AzureDocument is Azure's Scheduled Events document
// (GET /metadata/scheduledevents) as this package reads it; the local
// cluster's emulated cloud serves these fields and a few more.
type AzureDocument struct {
	DocumentIncarnation int          `json:"DocumentIncarnation"`
	Events              []AzureEvent `json:"Events"`
}

// AzureEvent is one scheduled event: the fields this package reads (a
// document's other fields are ignored, whatever their type).
type AzureEvent struct {
	EventID      string   `json:"EventId"`
	EventType    string   `json:"EventType"`
	ResourceType string   `json:"ResourceType"`
	Resources    []string `json:"Resources"`
	EventStatus  string   `json:"EventStatus"`
	NotBefore    string   `json:"NotBefore"`
}

// Poll reads the scheduled events once (and first this VM's name, when
// VMName is empty).
func (a *Azure) Poll(ctx context.Context) (Notice, error) {
	if a.VMName == "" {
		name, err := a.instanceName(ctx)
		if err != nil {
			return Notice{}, err
		}
		a.VMName = name
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base()+azureEventsPath, nil)
	if err != nil {
		return Notice{}, err
	}
	req.Header.Set(azureHeader, "true")
	body, _, err := do(httpClient(a.Client), req)
	if errors.Is(err, errNotFound) {
		return Notice{}, fmt.Errorf("azure scheduledevents: 404 Not Found (is this an Azure VM?)")
	}
	if err != nil {
		return Notice{}, err
	}
	return parseAzureEvents(body, a.VMName)
}

// instanceName reads this VM's name from the instance metadata.
func (a *Azure) instanceName(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base()+azureInstancePath, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set(azureHeader, "true")
	body, _, err := do(httpClient(a.Client), req)
	if err != nil {
		return "", fmt.Errorf("azure instance metadata (this VM's name, for its scheduled events; or set --azure-vm-name): %w", err)
	}
	var doc struct {
		Compute struct {
			Name string `json:"name"`
		} `json:"compute"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || doc.Compute.Name == "" {
		return "", fmt.Errorf("azure instance metadata %q: no compute.name (set --azure-vm-name): %v", body, err)
	}
	return doc.Compute.Name, nil
}

// parseAzureEvents reads a Scheduled Events document and returns the most
// pressing notice for vmName: a reclaim before an early warning, the
// earliest reclaim first. An empty vmName matches no event. Pure, for the
// fuzzer.
func parseAzureEvents(body []byte, vmName string) (Notice, error) {
	var doc AzureDocument
	if err := json.Unmarshal(body, &doc); err != nil {
		return Notice{}, fmt.Errorf("azure scheduledevents %q: %w", body, err)
	}
	best := Notice{Source: ProviderAzure}
	for _, ev := range doc.Events {
		if ev.EventStatus != "" && ev.EventStatus != "Scheduled" && ev.EventStatus != "Started" {
			continue
		}
		if vmName == "" || !slices.Contains(ev.Resources, vmName) {
			continue
		}
		var n Notice
		switch ev.EventType {
		case "Preempt", "Terminate":
			var deadline time.Time
			if ev.NotBefore != "" { // empty once the event has started
				var err error
				deadline, err = parseAzureTime(ev.NotBefore)
				if err != nil {
					return Notice{}, fmt.Errorf("azure event %s NotBefore %q: want RFC 1123 (Mon, 19 Sep 2016 18:29:47 GMT): %w", ev.EventID, ev.NotBefore, err)
				}
			}
			n = Notice{Kind: Reclaim, Deadline: deadline.UTC(), Source: ProviderAzure, Detail: ev.EventType + " " + ev.EventID, EventID: ev.EventID}
		case "Freeze", "Reboot", "Redeploy":
			n = Notice{Kind: EarlyWarning, Source: ProviderAzure, Detail: ev.EventType + " " + ev.EventID, EventID: ev.EventID}
		default:
			continue
		}
		if n.Kind > best.Kind || (n.Kind == Reclaim && best.Kind == Reclaim && n.Deadline.Before(best.Deadline)) {
			best = n
		}
	}
	return best, nil
}

// parseAzureTime reads NotBefore: RFC 1123 in GMT, as Azure documents it
// (http.TimeFormat). time.RFC1123 takes any zone abbreviation, one the
// node's own zone knows at that zone's offset and any other as UTC: "18:29:47
// EST" moved the deadline with the node's time zone (testdata/fuzz/FuzzAzure).
func parseAzureTime(s string) (time.Time, error) {
	return time.Parse(http.TimeFormat, s)
}

// Ack approves the event eventID (StartRequests), letting the platform go
// ahead without waiting for NotBefore; the agent calls it once the node's
// pods are gone.
func (a *Azure) Ack(ctx context.Context, eventID string) error {
	payload, err := json.Marshal(map[string][]map[string]string{"StartRequests": {{"EventId": eventID}}})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base()+azureEventsPath, bytes.NewReader(payload))
	if err != nil {
		return err
	}
	req.Header.Set(azureHeader, "true")
	req.Header.Set("Content-Type", "application/json")
	if _, _, err := do(httpClient(a.Client), req); err != nil {
		return fmt.Errorf("azure acknowledging event %s: %w", eventID, err)
	}
	return nil
}

func (a *Azure) base() string { return strings.TrimSuffix(or(a.BaseURL, DefaultAzureURL), "/") }
