// Package instance names the consumers a process runs, for lease owners,
// heartbeats and logs.
package instance

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
)

// NewID returns host-pid-random: readable in pg_stat_activity and logs, and
// different for every call, so two consumers of one process never share a
// lease owner.
func NewID() string {
	host, _ := os.Hostname()
	var b [3]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
