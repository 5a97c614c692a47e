package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat: 100
// on every Linux architecture Go supports (it is fixed in the kernel ABI).
const clockTicks = 100

// procSample is a process' CPU time and memory, read from /proc.
type procSample struct {
	CPU time.Duration // user + system time so far
	RSS int64         // resident set size, bytes (VmRSS)
	HWM int64         // peak resident set size, bytes (VmHWM)
}

// readProc samples process pid.
func readProc(pid int) (procSample, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procSample{}, err
	}
	cpu, err := parseStatCPU(string(stat))
	if err != nil {
		return procSample{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procSample{}, err
	}
	s := procSample{CPU: cpu}
	s.RSS, s.HWM = parseStatusKB(string(status), "VmRSS:")*1024, parseStatusKB(string(status), "VmHWM:")*1024
	return s, nil
}

// parseStatCPU returns utime+stime from a /proc/PID/stat line. The command
// name (field 2) may hold spaces, so fields are counted after its ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no ')' in %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(f))
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("utime %q stime %q", f[11], f[12])
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

func parseStatusKB(status, key string) int64 {
	for line := range strings.SplitSeq(status, "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// childPIDs returns the pids of this process' children by command name
// (comm): envtest starts kube-apiserver and etcd without telling their pids.
func childPIDs() map[string]int {
	out := map[string]int{}
	me := os.Getpid()
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		f := strings.Fields(s[closing+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == me {
			pid, _ := strconv.Atoi(strings.Fields(s)[0])
			out[s[open+1:closing]] = pid
		}
	}
	return out
}

// histogram is a cumulative Prometheus histogram: upper bounds (le) and
// counts, +Inf last.
type histogram struct {
	Bounds []float64
	Counts []float64
	Sum    float64
}

// count is the number of observations.
func (h histogram) count() float64 {
	if len(h.Counts) == 0 {
		return 0
	}
	return h.Counts[len(h.Counts)-1]
}

// minus returns h - old (the observations in between two scrapes).
func (h histogram) minus(old histogram) histogram {
	out := histogram{Bounds: h.Bounds, Counts: make([]float64, len(h.Counts)), Sum: h.Sum - old.Sum}
	for i := range h.Counts {
		out.Counts[i] = h.Counts[i]
		if i < len(old.Counts) {
			out.Counts[i] -= old.Counts[i]
		}
	}
	return out
}

// quantile estimates the q-quantile as Prometheus' histogram_quantile does:
// linear interpolation inside the bucket that holds it (from 0 for the first
// bucket); in the +Inf bucket, the highest finite bound. NaN when empty.
func (h histogram) quantile(q float64) float64 {
	n := h.count()
	if n == 0 {
		return math.NaN()
	}
	rank := q * n
	for i, c := range h.Counts {
		if c < rank {
			continue
		}
		if math.IsInf(h.Bounds[i], 1) {
			if i == 0 {
				return math.NaN()
			}
			return h.Bounds[i-1]
		}
		lo, below := 0.0, 0.0
		if i > 0 {
			lo, below = h.Bounds[i-1], h.Counts[i-1]
		}
		if c == below {
			return h.Bounds[i]
		}
		return lo + (h.Bounds[i]-lo)*(rank-below)/(c-below)
	}
	return h.Bounds[len(h.Bounds)-1]
}

// metrics is one scrape of the controller's Prometheus endpoint: the samples
// this benchmark reads.
type metrics struct {
	Reconcile histogram      // controller_runtime_reconcile_time_seconds{controller="elasticjob"}
	Requests  map[string]int // rest_client_requests_total by method
}

// scrape reads the controller's metrics endpoint (text exposition format).
func scrape(url string) (metrics, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return metrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return metrics{}, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body, "elasticjob")
}

// parseMetrics reads the text exposition format; it needs no Prometheus
// parser library, because it reads two metric families with simple labels.
func parseMetrics(r io.Reader, controller string) (metrics, error) {
	m := metrics{Requests: map[string]int{}}
	type bucket struct{ le, n float64 }
	var buckets []bucket
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, ok := splitSample(line)
		if !ok {
			continue
		}
		switch name {
		case "controller_runtime_reconcile_time_seconds_bucket":
			if labels["controller"] != controller {
				continue
			}
			le, err := strconv.ParseFloat(labels["le"], 64)
			if err != nil {
				return m, fmt.Errorf("bucket le %q: %w", labels["le"], err)
			}
			buckets = append(buckets, bucket{le, value})
		case "controller_runtime_reconcile_time_seconds_sum":
			if labels["controller"] == controller {
				m.Reconcile.Sum = value
			}
		case "rest_client_requests_total":
			m.Requests[labels["method"]] += int(value)
		}
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	for _, b := range buckets {
		m.Reconcile.Bounds = append(m.Reconcile.Bounds, b.le)
		m.Reconcile.Counts = append(m.Reconcile.Counts, b.n)
	}
	return m, sc.Err()
}

// splitSample splits `name{a="x",b="y"} value` (labels optional).
func splitSample(line string) (string, map[string]string, float64, bool) {
	labels := map[string]string{}
	name, rest := line, ""
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", nil, 0, false
		}
		name, rest = line[:i], line[j+1:]
		for kv := range strings.SplitSeq(line[i+1:j], ",") {
			k, v, ok := strings.Cut(kv, "=")
			if ok {
				labels[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"`)
			}
		}
	} else if i := strings.IndexByte(line, ' '); i >= 0 {
		name, rest = line[:i], line[i:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", nil, 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return "", nil, 0, false
	}
	return name, labels, v, true
}

// median of a sample (NaN when empty).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
