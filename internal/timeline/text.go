package timeline

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// TextWidth is the chart's width in columns when Text is given 0.
const TextWidth = 60

// maxRows is the chart's height at most; a larger job's rows hold several
// workers each, drawn with partial blocks.
const maxRows = 8

// Mark is how one kind of event shows under the chart.
type Mark struct {
	Symbol byte
	Name   string
	// rank decides which mark a column shows when several events fall in
	// it: the one that changes the job most.
	rank int
}

var (
	markNotice  = Mark{'N', "notice", 7}
	markLeave   = Mark{'L', "leave", 6}
	markChange  = Mark{'C', "join+leave", 5}
	markSuspend = Mark{'S', "suspend/stop", 4}
	markResume  = Mark{'R', "resume", 3}
	markJoin    = Mark{'J', "join", 2}
	markOther   = Mark{'*', "other", 1}
	// Marks are every mark, in the legend's order.
	Marks = []Mark{markJoin, markLeave, markChange, markNotice, markSuspend, markResume, markOther}
)

// MarkOf is the mark of an event type.
func MarkOf(typ string) Mark {
	switch typ {
	case etjobv1.TimelineNotice:
		return markNotice
	case etjobv1.TimelineLeave, etjobv1.TimelineRelease:
		return markLeave
	case etjobv1.TimelineChange:
		return markChange
	case etjobv1.TimelineSuspend, etjobv1.TimelineStop, etjobv1.TimelineMove, TypeStopped:
		return markSuspend
	case etjobv1.TimelineResume, TypeTrained:
		return markResume
	case etjobv1.TimelineJoin:
		return markJoin
	}
	return markOther
}

// Text renders t for a terminal, width columns wide (0: TextWidth): a chart
// of the members over time (of the ranks training when no members are
// known), the events' marks under it, the training step as a sparkline when
// logged, then every event on a line of its own. Times are offsets from
// Start, which the heading gives in UTC.
func (t Timeline) Text(width int) string {
	if width <= 0 {
		width = TextWidth
	}
	var b strings.Builder
	series, what := t.Members, "members"
	if len(series) == 0 {
		series, what = t.World, "ranks training"
	}
	if len(series) == 0 && len(t.Events) == 0 && len(t.Steps) == 0 {
		fmt.Fprintf(&b, "%s: no timeline yet (the controller records joins, leaves, stops, suspends and resumes in status.timeline)\n", t.Job)
		return b.String()
	}
	span := t.End.Sub(t.Start)
	fmt.Fprintf(&b, "%s: %s, %s to %s UTC\n", t.Job, offset(span), t.Start.UTC().Format("2006-01-02 15:04:05"), endFormat(t.Start, t.End))
	if t.Truncated {
		b.WriteString("(older events were dropped: status.timeline keeps the newest 64)\n")
	}
	at := func(col int) time.Time {
		return t.Start.Add(time.Duration(float64(span) * (float64(col) + 0.5) / float64(width)))
	}
	col := func(at time.Time) int {
		if span <= 0 {
			return 0
		}
		return min(width-1, max(0, int(float64(at.Sub(t.Start))/float64(span)*float64(width))))
	}

	top := max(1, MaxValue(series))
	rows, perRow := top, 1.0
	if top > maxRows {
		rows, perRow = maxRows, float64(top)/maxRows
	}
	label := func(r int) string { return fmt.Sprint(int(float64(r)*perRow + 0.5)) }
	margin := len(label(rows)) + 3
	fmt.Fprintf(&b, "\n%s\n", what)
	for r := rows; r >= 1; r-- {
		line := []rune(fmt.Sprintf("%*s ┤", margin-2, label(r)))
		for c := range width {
			v, ok := valueAt(series, at(c))
			line = append(line, cell(v, ok, float64(r-1)*perRow, perRow))
		}
		b.WriteString(strings.TrimRight(string(line), " ") + "\n")
	}
	b.WriteString(fmt.Sprintf("%*s └", margin-2, "0") + strings.Repeat("─", width) + "\n")

	row := []byte(strings.Repeat(" ", width))
	seen := map[Mark]bool{}
	for _, e := range t.Events {
		m, c := MarkOf(e.Type), col(e.At)
		seen[m] = true
		if row[c] == ' ' || m.rank > markBySymbol(row[c]).rank {
			row[c] = m.Symbol
		}
	}
	if len(t.Events) > 0 {
		b.WriteString(strings.Repeat(" ", margin) + strings.TrimRight(string(row), " ") + "\n")
	}
	b.WriteString(strings.Repeat(" ", margin) + ticks(width, span) + "\n")
	if len(t.Steps) > 0 {
		b.WriteString(sparkline(t.Steps, width, margin, at))
	}
	if len(seen) > 0 {
		var legend []string
		for _, m := range Marks {
			if seen[m] {
				legend = append(legend, string(m.Symbol)+" "+m.Name)
			}
		}
		b.WriteString(strings.Repeat(" ", margin) + strings.Join(legend, "  ") + "\n")
	}

	if len(t.Events) > 0 {
		b.WriteString("\nevents\n")
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		for _, e := range t.Events {
			members := ""
			if e.Members >= 0 {
				members = fmt.Sprintf("%d members", e.Members)
			}
			fmt.Fprintf(tw, "  +%s\t%s\t%s\t%s\n", offset(e.At.Sub(t.Start)), e.Type, members, oneLine(e.Message))
		}
		_ = tw.Flush()
	}
	return b.String()
}

// cell draws value v in the row spanning (lower, lower+perRow]: full, a
// partial block, or empty; blank where v is unknown.
func cell(v int, ok bool, lower, perRow float64) rune {
	const blocks = " ▁▂▃▄▅▆▇█"
	if !ok {
		return ' '
	}
	f := (float64(v) - lower) / perRow
	switch {
	case f >= 1:
		return '█'
	case f <= 0:
		return ' '
	}
	return []rune(blocks)[max(1, int(f*8+0.5))]
}

func markBySymbol(s byte) Mark {
	for _, m := range Marks {
		if m.Symbol == s {
			return m
		}
	}
	return Mark{}
}

// ticks labels the time axis at its start, quarters and end, leaving out a
// label that would touch the one before.
func ticks(width int, span time.Duration) string {
	if span <= 0 {
		return "0s"
	}
	row := []byte(strings.Repeat(" ", width+8))
	next := 0
	for q := 0; q <= 4; q++ {
		l := offset(span * time.Duration(q) / 4)
		c := width * q / 4
		if q == 4 {
			c = width - len(l)
		}
		if c < next || c+len(l) > len(row) {
			continue
		}
		copy(row[c:], l)
		next = c + len(l) + 1
	}
	return strings.TrimRight(string(row), " ")
}

// sparkline draws the training step over time with the highest at the end.
func sparkline(steps []Point, width, margin int, at func(int) time.Time) string {
	const levels = "▁▂▃▄▅▆▇█"
	top := max(1, MaxValue(steps))
	line := []rune(fmt.Sprintf("%-*s", margin, "step"))
	for c := range width {
		v, ok := valueAt(steps, at(c))
		if !ok {
			line = append(line, ' ')
			continue
		}
		line = append(line, []rune(levels)[min(7, v*8/(top+1))])
	}
	return string(line) + fmt.Sprintf(" %d\n", MaxValue(steps))
}

// offset formats a duration for the time axis and the event list: 45s,
// 1m30s, 3m, 1h05m.
func offset(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < 0:
		return "-" + offset(-d)
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		m, s := int(d/time.Minute), int(d%time.Minute/time.Second)
		if s == 0 {
			return fmt.Sprintf("%dm", m)
		}
		return fmt.Sprintf("%dm%02ds", m, s)
	}
	h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
	if m == 0 {
		return fmt.Sprintf("%dh", h)
	}
	return fmt.Sprintf("%dh%02dm", h, m)
}

// endFormat gives the end's time of day, with its date when that differs
// from the start's.
func endFormat(start, end time.Time) string {
	if s, e := start.UTC(), end.UTC(); s.YearDay() == e.YearDay() && s.Year() == e.Year() {
		return e.Format("15:04:05")
	}
	return end.UTC().Format("2006-01-02 15:04:05")
}

// oneLine keeps a message on its line of the list.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
