// Package harness is what every benchmark program shares: the flags, the
// one-line JSON result, the delivery tracker that proves every message was
// handled, the paced producer, the PostgreSQL set-up, and the held
// transaction of workload W5. The workloads are described in
// bench/README.md.
package harness
