package harness

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"time"
)

// DefaultDSN is the database the programs use unless -dsn says otherwise.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/bench?sslmode=disable"

// Run is one run's settings: the flags every program takes.
type Run struct {
	System   string // the result line's "system"
	DSN      string
	Workload string // W1..W5, or a program's own
	N        int    // messages; for W5, Rate × Duration
	Workers  int    // producers (W1) or consumer concurrency (W2, W4, W5)
	Groups   int    // consumer groups (W3)
	Rate     int    // messages a second (W4, W5)
	Duration time.Duration
	Timeout  time.Duration
}

// Register adds the common flags to fs, with their defaults.
func (r *Run) Register(fs *flag.FlagSet) {
	fs.StringVar(&r.DSN, "dsn", DefaultDSN, "PostgreSQL connection string")
	fs.StringVar(&r.Workload, "workload", "W1", "W1 produce | W2 queue drain | W3 fan-out drain | W4 latency | W5 held xmin")
	fs.IntVar(&r.N, "n", 0, "messages (0 = the workload's default)")
	fs.IntVar(&r.Workers, "workers", 8, "producer goroutines (W1) / consumer concurrency (W2, W4, W5)")
	fs.IntVar(&r.Groups, "groups", 4, "consumer groups (W3)")
	fs.IntVar(&r.Rate, "rate", 500, "produce rate in messages a second (W4, W5)")
	fs.DurationVar(&r.Duration, "duration", 60*time.Second, "W5: how long the producer runs (n = rate × duration)")
	fs.DurationVar(&r.Timeout, "timeout", 5*time.Minute, "abort after this long")
}

// DefaultN is each common workload's message count.
var DefaultN = map[string]int{"W1": 20000, "W2": 50000, "W3": 20000, "W4": 2000, "W5": 0}

// ErrPacedN: -n was given to a workload whose count is -rate × -duration.
var ErrPacedN = errors.New("-n is set by -rate and -duration for this workload")

// Check validates the flags after parsing. defaults gives each workload
// the program knows its message count; paced names the workloads whose
// count is Rate × Duration.
func (r *Run) Check(defaults map[string]int, paced ...string) error {
	r.Workload = strings.ToUpper(r.Workload)
	if _, ok := defaults[r.Workload]; !ok {
		return fmt.Errorf("unknown workload %q", r.Workload)
	}
	if r.Workers < 1 || r.Groups < 1 || r.Rate < 1 {
		return errors.New("-workers, -groups and -rate must be >= 1")
	}
	for _, w := range paced {
		if r.Workload == w {
			if r.N > 0 {
				return ErrPacedN
			}
			r.N = int(float64(r.Rate) * r.Duration.Seconds())
		}
	}
	if r.N <= 0 {
		r.N = defaults[r.Workload]
	}
	return nil
}

// Result is the line a run prints on stdout.
type Result struct {
	System     string  `json:"system"`
	Workload   string  `json:"workload"`
	N          int     `json:"n"`
	Seconds    float64 `json:"seconds"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	// W3: how many groups, and how long their looks for work took, where
	// a program knows.
	Groups     int     `json:"groups,omitempty"`
	Fetches    int     `json:"fetches,omitempty"`
	FetchP50Ms float64 `json:"fetch_p50_ms,omitempty"`
	FetchP95Ms float64 `json:"fetch_p95_ms,omitempty"`
	FetchP99Ms float64 `json:"fetch_p99_ms,omitempty"`
}

// Result returns the run's result for deliveries in elapsed, with the
// latency percentiles p50 and p99 (milliseconds).
func (r *Run) Result(elapsed time.Duration, deliveries int, p50, p99 float64) Result {
	s := elapsed.Seconds()
	return Result{System: r.System, Workload: r.Workload, N: r.N, Seconds: Round(s, 4),
		MsgsPerSec: Round(float64(deliveries)/s, 1), P50Ms: Round(p50, 3), P99Ms: Round(p99, 3)}
}

// Emit prints the run's result line.
func (r *Run) Emit(elapsed time.Duration, deliveries int, p50, p99 float64) {
	Print(r.Result(elapsed, deliveries, p50, p99))
}

// Print prints v as the run's one JSON line.
func Print(v any) {
	out, err := json.Marshal(v)
	if err != nil {
		out = []byte(fmt.Sprintf(`{"error":%q}`, err.Error()))
	}
	fmt.Println(string(out))
}

// Unsupported prints the line of a workload the system cannot do, and
// exits 0.
func (r *Run) Unsupported(why string) {
	Print(map[string]any{"system": r.System, "workload": r.Workload, "unsupported": true})
	Logf("%s %s unsupported: %s", r.System, r.Workload, why)
	os.Exit(0)
}

// Fail prints the line of a failed run and exits 1.
func (r *Run) Fail(err error) {
	Print(map[string]any{"system": r.System, "workload": r.Workload, "n": r.N, "error": err.Error()})
	os.Exit(1)
}

// Round rounds v to digits decimals.
func Round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// Logf writes a diagnostic line to stderr.
func Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
