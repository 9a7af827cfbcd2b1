package server

import (
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
)

// BucketMemoryShare is the part of GOMEMLIMIT, in percent, that
// DefaultBucketMemory gives the buckets: the rest is for the GC's headroom,
// gRPC buffers, the rule table and Raft.
const BucketMemoryShare = 50

// DefaultBucketMemory is the bucket memory budget when none is configured:
// BucketMemoryShare percent of the Go memory limit (GOMEMLIMIT) when one is
// set, else 1 GiB.
func DefaultBucketMemory() int64 {
	if limit := debug.SetMemoryLimit(-1); limit > 0 && limit < math.MaxInt64 {
		return limit / 100 * BucketMemoryShare
	}
	return 1 << 30
}

// MemoryLimitFor is the soft memory limit (debug.SetMemoryLimit) a node
// with bucket budget bytes sets when GOMEMLIMIT is not: 1.25 × budget +
// 48 MiB. Live buckets never exceed the budget, so the rest is the GC's
// headroom, gRPC buffers, the rule table and Raft; the node's peak RSS
// stays within 1.25 × budget + 64 MiB (16 MiB for what the Go runtime
// does not count, or returns late: the binary's text, freed pages not
// yet scavenged). Without it
// GOGC=400 (--gc-percent) lets the heap grow to five times the live
// buckets under a key flood.
func MemoryLimitFor(budget int64) int64 {
	return budget + budget/4 + 48<<20
}

// ParseBytes reads a size in bytes: a whole number with an optional suffix
// KiB, MiB, GiB or TiB (powers of 1024; K, M, G, T, KB, MB, GB and TB are
// read the same way, as operators mean them for memory).
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToUpper(strings.TrimSpace(t[i:]))
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a whole number of bytes with an optional KiB, MiB or GiB suffix", s)
	}
	shift := 0
	switch strings.TrimSuffix(strings.TrimSuffix(unit, "IB"), "B") {
	case "":
	case "K":
		shift = 10
	case "M":
		shift = 20
	case "G":
		shift = 30
	case "T":
		shift = 40
	default:
		return 0, fmt.Errorf("size %q: unknown unit %q (want KiB, MiB, GiB or TiB)", s, t[i:])
	}
	if n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n << shift, nil
}

// FormatBytes writes n as ParseBytes reads it, in the largest unit that
// divides it.
func FormatBytes(n int64) string {
	for _, u := range []struct {
		shift int
		name  string
	}{{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// BytesFlag is a flag.Value of a size in bytes (ParseBytes).
type BytesFlag struct{ P *int64 }

// String implements flag.Value.
func (f BytesFlag) String() string {
	if f.P == nil {
		return "0"
	}
	return FormatBytes(*f.P)
}

// Set implements flag.Value.
func (f BytesFlag) Set(s string) error {
	n, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*f.P = n
	return nil
}
