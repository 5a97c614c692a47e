package driver

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// LogLine is one line of the example's training log (examples/digits/train.py),
// from any pod, with its wall time.
type LogLine struct {
	Pod  string
	Kind string // step, resume, checkpoint, stop, final, loss, ledger
	Step int
	Rank int
	// World is the world size of a step or resume line.
	World int
	// Value is the accuracy of a final line, the held-out loss of a loss
	// line (`final loss=L`, examples/ddp_tutorial), or the rest of a
	// ledger line.
	Value string
	T     float64
	// Pid and Gen are the process and the etjob.elastic generation of a
	// step line of examples/digits/train_elastic.py (0 in train.py's).
	Pid, Gen int
}

var (
	stepRe  = regexp.MustCompile(`^step=(\d+) epoch=\d+ rank=(\d+) world=(\d+) loss=\S+(?: pid=(\d+) gen=(\d+))? t=([\d.]+)`)
	eventRe = regexp.MustCompile(`^(resume|checkpoint|stop) step=(\d+)(?: world=(\d+))?.* t=([\d.]+)`)
	finalRe = regexp.MustCompile(`^final accuracy=([\d.]+) steps=(\d+) t=([\d.]+)`)
	ledgeRe = regexp.MustCompile(`^ledger (.*) t=([\d.]+)`)
	lossRe  = regexp.MustCompile(`^final loss=([\d.]+)$`)
)

// ReadLogs reads every worker log of job under the cluster directory (process
// nodes keep pod logs at nodes/<node>/pods/<ns>_<pod>_<uid>/<container>.log,
// also after the node is gone) and returns the lines in time order.
func ReadLogs(clusterDir, namespace, job string) ([]LogLine, error) {
	files, err := filepath.Glob(filepath.Join(clusterDir, "nodes", "*", "pods", namespace+"_"+job+"-worker-*", "*.log"))
	if err != nil {
		return nil, err
	}
	var out []LogLine
	for _, f := range files {
		pod := strings.SplitN(filepath.Base(filepath.Dir(f)), "_", 3)[1]
		lines, err := parseLog(f, pod)
		if err != nil {
			return nil, err
		}
		out = append(out, lines...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].T < out[j].T })
	return out, nil
}

func parseLog(path, pod string) ([]LogLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parse(f, pod)
}

// ParseLines parses the lines of one process's output (a local run's).
func ParseLines(text string) []LogLine {
	lines, _ := parse(strings.NewReader(text), "")
	return lines
}

func parse(r io.Reader, pod string) ([]LogLine, error) {
	var out []LogLine
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := stepRe.FindStringSubmatch(line); m != nil {
			out = append(out, LogLine{Pod: pod, Kind: "step", Step: atoi(m[1]), Rank: atoi(m[2]), World: atoi(m[3]),
				Pid: atoi(m[4]), Gen: atoi(m[5]), T: atof(m[6])})
		} else if m := eventRe.FindStringSubmatch(line); m != nil {
			out = append(out, LogLine{Pod: pod, Kind: m[1], Step: atoi(m[2]), World: atoi(m[3]), T: atof(m[4])})
		} else if m := finalRe.FindStringSubmatch(line); m != nil {
			out = append(out, LogLine{Pod: pod, Kind: "final", Value: m[1], Step: atoi(m[2]), T: atof(m[3])})
		} else if m := ledgeRe.FindStringSubmatch(line); m != nil {
			out = append(out, LogLine{Pod: pod, Kind: "ledger", Value: m[1], T: atof(m[2])})
		} else if m := lossRe.FindStringSubmatch(line); m != nil {
			// no time of its own: it comes right after the final line
			out = append(out, LogLine{Pod: pod, Kind: "loss", Value: m[1], T: lastT(out)})
		}
	}
	return out, sc.Err()
}

func lastT(lines []LogLine) float64 {
	if len(lines) == 0 {
		return 0
	}
	return lines[len(lines)-1].T
}

// Resume is one (re)start of training and what it cost.
type Resume struct {
	T float64
	// From is the step training resumed from (the checkpoint's).
	From int
	// Reached is the highest step any rank finished before this resume.
	Reached int
	// Lost is Reached - From: committed steps done again.
	Lost int
	// AfterStop says the previous run ended with an agreed stop.
	AfterStop bool
	World     int
}

// Resumes returns every restart of training after the first start, with the
// steps it lost.
func Resumes(lines []LogLine) []Resume {
	var out []Resume
	reached, started, stopped := 0, false, false
	for _, l := range lines {
		switch l.Kind {
		case "step":
			reached = max(reached, l.Step)
		case "stop":
			stopped = true
		case "resume":
			if started {
				out = append(out, Resume{T: l.T, From: l.Step, Reached: reached, Lost: max(0, reached-l.Step), AfterStop: stopped, World: l.World})
			}
			started, stopped = true, false
		}
	}
	return out
}

// Final returns the final accuracy line, if training finished.
func Final(lines []LogLine) (accuracy float64, steps int, ok bool) {
	for _, l := range lines {
		if l.Kind == "final" {
			return atof(l.Value), l.Step, true
		}
	}
	return 0, 0, false
}

// FinalLoss returns the held-out loss of a `final loss=L` line, if
// training finished (examples/ddp_tutorial prints one).
func FinalLoss(lines []LogLine) (loss float64, ok bool) {
	for _, l := range lines {
		if l.Kind == "loss" {
			return atof(l.Value), true
		}
	}
	return 0, false
}

// LedgerOK reports whether the sampler ledger check passed at the end.
func LedgerOK(lines []LogLine) (ok bool, detail string) {
	for _, l := range lines {
		if l.Kind == "ledger" {
			return l.Value == "ok", l.Value
		}
	}
	return false, "no ledger line (training did not finish)"
}

// MaxStep is the highest step any rank finished.
func MaxStep(lines []LogLine) int {
	m := 0
	for _, l := range lines {
		if l.Kind == "step" {
			m = max(m, l.Step)
		}
	}
	return m
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

func atof(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64)
	return f
}
