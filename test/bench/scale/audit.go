package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// controllerUser is the user the controller authenticates as; the audit
// policy records only its requests.
const controllerUser = "etjob-controller"

// auditPolicy records every request of the controller at Metadata level
// (verb, resource, subresource, namespace, name, response code; no bodies) and
// nothing else. RequestReceived is omitted so that each request is one line;
// watches also log ResponseStarted, which marks when a watch was established.
var auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["` + controllerUser + `"]
- level: None
`

// request is one API request of the controller, from the audit log.
type request struct {
	Verb        string    `json:"verb"`
	Group       string    `json:"group,omitempty"`
	Resource    string    `json:"resource"`
	Subresource string    `json:"subresource,omitempty"`
	Namespace   string    `json:"namespace,omitempty"`
	Name        string    `json:"name,omitempty"`
	Code        int       `json:"code"`
	At          time.Time `json:"at"`
	// InitialEvents: a watch that starts by sending every object
	// (sendInitialEvents=true, client-go's watch-list), which reads the whole
	// collection as a LIST does.
	InitialEvents bool `json:"sendInitialEvents,omitempty"`
}

// auditEvent is the part of an audit.k8s.io/v1 Event this benchmark reads.
type auditEvent struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
}

// parseAuditLine turns one audit log line into a request of user. It reports
// false for other users, for non-resource requests (/healthz, /api
// discovery), and for the second line of a watch (ResponseComplete, when it
// ends): a watch counts once, when it is established (ResponseStarted); every
// other request counts once, when it completed.
func parseAuditLine(line []byte, user string) (request, bool, error) {
	var ev auditEvent
	if err := json.Unmarshal(line, &ev); err != nil {
		return request{}, false, err
	}
	if ev.User.Username != user || ev.ObjectRef == nil || ev.ObjectRef.Resource == "" {
		return request{}, false, nil
	}
	switch {
	case ev.Verb == "watch" && ev.Stage != "ResponseStarted":
		return request{}, false, nil
	case ev.Verb != "watch" && ev.Stage != "ResponseComplete":
		return request{}, false, nil
	}
	r := request{
		Verb: ev.Verb, Group: ev.ObjectRef.APIGroup, Resource: ev.ObjectRef.Resource, Subresource: ev.ObjectRef.Subresource,
		Namespace: ev.ObjectRef.Namespace, Name: ev.ObjectRef.Name, At: ev.RequestReceivedTimestamp,
	}
	if ev.ResponseStatus != nil {
		r.Code = ev.ResponseStatus.Code
	}
	if r.Verb == "watch" {
		if u, err := url.Parse(ev.RequestURI); err == nil {
			r.InitialEvents = u.Query().Get("sendInitialEvents") == "true"
		}
	}
	return r, true, nil
}

// isWrite: a request that changes an object.
func (r request) isWrite() bool {
	switch r.Verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// fullRead: a LIST, or a watch-list, which reads the whole collection.
func (r request) fullRead() bool { return r.Verb == "list" || (r.Verb == "watch" && r.InitialEvents) }

// verbKind is "verb kind", with "watch-list" for a watch with initial events.
func (r request) verbKind() string {
	v := r.Verb
	if r.InitialEvents {
		v = "watch-list"
	}
	return v + " " + r.kind()
}

// isEvent: a request to core or events.k8s.io Events, which issue #6's goals
// exclude (the recorder's writes are asynchronous and best-effort).
func (r request) isEvent() bool { return r.Resource == "events" }

// countedWrite: a write that the goal of writes per scale event counts.
func (r request) countedWrite() bool { return r.isWrite() && !r.isEvent() }

// kind is "resource" or "resource/subresource", with the API group for
// non-core groups ("elasticjobs.etjob.dev/status").
func (r request) kind() string {
	k := r.Resource
	if r.Group != "" {
		k += "." + r.Group
	}
	if r.Subresource != "" {
		k += "/" + r.Subresource
	}
	return k
}

// String prints a request as a breakdown line: verb, resource, name, code.
func (r request) String() string {
	name := r.Name
	if r.Namespace != "" {
		name = r.Namespace + "/" + name
	}
	v := r.Verb
	if r.InitialEvents {
		v = "watch-list"
	}
	return fmt.Sprintf("%-7s %-32s %-36s %d", v, r.kind(), name, r.Code)
}

// auditLog reads the API server's audit log as it grows.
type auditLog struct {
	path string
	user string

	mu       sync.Mutex
	offset   int64     // bytes consumed so far (whole lines only)
	requests []request // every request of user seen so far, in log order
	lastAt   time.Time // when the last counted write of user was read
}

func newAuditLog(path, user string) *auditLog { return &auditLog{path: path, user: user} }

// poll reads the lines written since the last poll and returns how many
// requests there are in all.
func (a *auditLog) poll() (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f, err := os.Open(a.path)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if _, err := f.Seek(a.offset, io.SeekStart); err != nil {
		return 0, err
	}
	rd := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := rd.ReadBytes('\n')
		if err == io.EOF {
			break // a partial last line is read again next time
		}
		if err != nil {
			return 0, err
		}
		a.offset += int64(len(line))
		r, ok, perr := parseAuditLine(bytes.TrimSpace(line), a.user)
		if perr != nil {
			return 0, fmt.Errorf("audit log %s at byte %d: %w", a.path, a.offset, perr)
		}
		if ok {
			a.requests = append(a.requests, r)
			if r.countedWrite() {
				a.lastAt = time.Now()
			}
		}
	}
	return len(a.requests), nil
}

// mark returns the number of requests read so far, to slice from later.
func (a *auditLog) mark() (int, error) { return a.poll() }

// since returns the requests read after mark m (after a fresh poll).
func (a *auditLog) since(m int) ([]request, error) {
	if _, err := a.poll(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.requests[m:]), nil
}

// between returns the requests read between marks m and n.
func (a *auditLog) between(m, n int) []request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.requests[m:n])
}

// waitQuiet polls until no counted write of the controller appeared for
// quiet, or until limit passed; it reports whether it got quiet.
func (a *auditLog) waitQuiet(quiet, limit time.Duration) (bool, error) {
	start := time.Now()
	for {
		if _, err := a.poll(); err != nil {
			return false, err
		}
		a.mu.Lock()
		last := a.lastAt
		a.mu.Unlock()
		now := time.Now()
		if now.Sub(last) >= quiet && now.Sub(start) >= quiet {
			return true, nil
		}
		if now.Sub(start) > limit {
			return false, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tally counts requests by a key, for tables.
type tally map[string]int

func (t tally) String() string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, t[k]))
	}
	return strings.Join(parts, ", ")
}

// summary splits a list of requests the way the goals of issue #6 count them.
type summary struct {
	Writes      int   `json:"writes"`      // counted writes (Events excluded)
	EventWrites int   `json:"eventWrites"` // writes of Events
	Gets        int   `json:"gets"`
	Lists       int   `json:"lists"`
	Watches     int   `json:"watches"`
	ByKind      tally `json:"byKind"` // counted writes by "verb kind"
	Reads       tally `json:"reads"`  // LISTs and WATCHes by "verb kind"
}

func summarize(rs []request) summary {
	s := summary{ByKind: tally{}, Reads: tally{}}
	for _, r := range rs {
		switch {
		case r.countedWrite():
			s.Writes++
			s.ByKind[r.Verb+" "+r.kind()]++
		case r.isWrite():
			s.EventWrites++
		case r.Verb == "get":
			s.Gets++
		case r.Verb == "list":
			s.Lists++
			s.Reads[r.verbKind()]++
		case r.Verb == "watch":
			s.Watches++
			s.Reads[r.verbKind()]++
		}
	}
	return s
}

// relists returns the full reads (LISTs and watch-lists) of a resource in a
// scope that the controller already read in full once: an informer reads its
// collection once when it starts (a LIST then a WATCH, or one watch-list), so
// a second full read is a relist (a watch that broke for good, a resync) or a
// read that bypasses the cache. Both count as "LIST after the initial sync".
// Refused attempts before the first success (the API server answers 429
// while the watch cache of a new CRD initializes) are the initial sync.
func relists(rs []request) []request {
	read := map[string]bool{}
	var out []request
	for _, r := range rs {
		if !r.fullRead() {
			continue
		}
		scope := r.kind() + "@" + r.Namespace
		if read[scope] {
			out = append(out, r)
		}
		if r.ok() {
			read[scope] = true
		}
	}
	return out
}

// ok: the API server accepted the request.
func (r request) ok() bool { return r.Code >= 200 && r.Code < 300 }
