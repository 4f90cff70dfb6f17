// Command table reads the result lines of benchmark runs (one JSON object
// a line, as run.sh collects them in runs.jsonl) on stdin and prints a
// Markdown table: per system and workload, the median of the runs and
// their range, and each system's throughput as a multiple of rawpg's.
//
//	go run ./cmd/table < results/20261204T030000Z/runs.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// line is what the table reads of a result line.
type line struct {
	System      string   `json:"system"`
	Workload    string   `json:"workload"`
	N           int      `json:"n"`
	MsgsPerSec  float64  `json:"msgs_per_sec"`
	P50Ms       float64  `json:"p50_ms"`
	P99Ms       float64  `json:"p99_ms"`
	AP99Ms      *float64 `json:"a_p99_ms"`
	BP99Ms      *float64 `json:"b_p99_ms"`
	CP99Ms      *float64 `json:"c_p99_ms"`
	BOverAP99   *float64 `json:"b_over_a_p99"`
	DeadTuples  *float64 `json:"dead_tuples_end"`
	Unsupported bool     `json:"unsupported"`
	Error       string   `json:"error"`
}

// column is one column of the table: a workload's figure.
type column struct {
	title    string
	workload string
	value    func(line) *float64
}

func field(f func(line) float64) func(line) *float64 {
	return func(l line) *float64 { v := f(l); return &v }
}

var columns = []column{
	{"W1 produce msg/s", "W1", field(func(l line) float64 { return l.MsgsPerSec })},
	{"W2 queue drain msg/s", "W2", field(func(l line) float64 { return l.MsgsPerSec })},
	{"W3 fan-out deliveries/s", "W3", field(func(l line) float64 { return l.MsgsPerSec })},
	{"W4 p50 ms", "W4", field(func(l line) float64 { return l.P50Ms })},
	{"W4 p99 ms", "W4", field(func(l line) float64 { return l.P99Ms })},
	{"W4 achieved msg/s", "W4", field(func(l line) float64 { return l.MsgsPerSec })},
	{"W5 p99 ms before / during / after the hold", "W5", nil},
	{"W5 during/before p99", "W5", func(l line) *float64 { return l.BOverAP99 }},
	{"W5 dead tuples", "W5", func(l line) *float64 { return l.DeadTuples }},
}

// throughput are the columns compared with rawpg.
var throughput = []string{"W1", "W2", "W3"}

func main() {
	lines, err := read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	write(os.Stdout, lines)
}

func read(r io.Reader) ([]line, error) {
	var lines []line
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("%q: %w", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines, sc.Err()
}

func write(w io.Writer, lines []line) {
	var systems, workloads []string
	runs := map[[2]string][]line{}
	for _, l := range lines {
		if !slices.Contains(systems, l.System) {
			systems = append(systems, l.System)
		}
		if !slices.Contains(workloads, l.Workload) {
			workloads = append(workloads, l.Workload)
		}
		k := [2]string{l.System, l.Workload}
		runs[k] = append(runs[k], l)
	}
	var cols []column
	for _, c := range columns {
		if slices.Contains(workloads, c.workload) {
			cols = append(cols, c)
		}
	}
	fmt.Fprint(w, "| system |")
	for _, c := range cols {
		fmt.Fprintf(w, " %s |", c.title)
	}
	fmt.Fprint(w, "\n|---|")
	fmt.Fprint(w, strings.Repeat("---|", len(cols)))
	fmt.Fprintln(w)
	for _, s := range systems {
		fmt.Fprintf(w, "| %s |", s)
		for _, c := range cols {
			fmt.Fprintf(w, " %s |", cell(runs[[2]string{s, c.workload}], c))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "\nCells: median (min–max) of the runs; W3 counts deliveries (messages × groups). A cell with errors says how many runs failed.")
	ratios(w, systems, runs)
}

// cell is the median and range of a column over the runs of one system.
func cell(runs []line, c column) string {
	var ok []line
	failed := 0
	for _, l := range runs {
		switch {
		case l.Unsupported:
			return "unsupported"
		case l.Error != "":
			failed++
		default:
			ok = append(ok, l)
		}
	}
	var s string
	switch {
	case len(ok) == 0 && failed == 0:
		return "–"
	case len(ok) == 0:
	case c.value == nil: // W5's three phases
		a := spread(ok, func(l line) *float64 { return l.AP99Ms })
		b := spread(ok, func(l line) *float64 { return l.BP99Ms })
		cc := spread(ok, func(l line) *float64 { return l.CP99Ms })
		s = a + " / " + b + " / " + cc
	default:
		s = spread(ok, c.value)
	}
	if failed > 0 {
		s = strings.TrimSpace(fmt.Sprintf("%s (%d of %d runs failed)", s, failed, len(runs)))
	}
	if len(ok) > 0 && defaultN[c.workload] != 0 && ok[0].N != defaultN[c.workload] {
		s += fmt.Sprintf(" [n=%d]", ok[0].N) // River's small W2, say
	}
	return s
}

// defaultN is each workload's usual message count.
var defaultN = map[string]int{"W1": 20000, "W2": 50000, "W3": 20000, "W4": 2000}

// spread is "median (min–max)" of f over runs, or the median alone for
// one run; runs without the figure are left out.
func spread(runs []line, f func(line) *float64) string {
	var v []float64
	for _, l := range runs {
		if x := f(l); x != nil {
			v = append(v, *x)
		}
	}
	if len(v) == 0 {
		return "–"
	}
	slices.Sort(v)
	if len(v) == 1 {
		return num(v[0])
	}
	return fmt.Sprintf("%s (%s–%s)", num(median(v)), num(v[0]), num(v[len(v)-1]))
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// ratios prints each system's median throughput over rawpg's.
func ratios(w io.Writer, systems []string, runs map[[2]string][]line) {
	base := map[string]float64{}
	baseN := map[string]int{}
	for _, wl := range throughput {
		if m, n, ok := medianOf(runs[[2]string{"rawpg", wl}]); ok {
			base[wl], baseN[wl] = m, n
		}
	}
	if len(base) == 0 {
		return
	}
	var compared []string
	fmt.Fprint(w, "\n| system |")
	for _, wl := range throughput {
		if _, ok := base[wl]; ok {
			compared = append(compared, wl)
			fmt.Fprintf(w, " %s × rawpg |", wl)
		}
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(compared)))
	for _, s := range systems {
		fmt.Fprintf(w, "| %s |", s)
		for _, wl := range compared {
			m, n, ok := medianOf(runs[[2]string{s, wl}])
			if b := base[wl]; ok && b > 0 && n == baseN[wl] {
				fmt.Fprintf(w, " %.2f |", m/b)
			} else {
				fmt.Fprint(w, " – |")
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "\nRatios of medians; none where a system ran a workload with another n than rawpg.")
}

// medianOf is the median throughput of the runs that succeeded, and
// their n.
func medianOf(runs []line) (m float64, n int, ok bool) {
	var v []float64
	for _, l := range runs {
		if !l.Unsupported && l.Error == "" {
			v, n = append(v, l.MsgsPerSec), l.N
		}
	}
	if len(v) == 0 {
		return 0, 0, false
	}
	slices.Sort(v)
	return median(v), n, true
}
