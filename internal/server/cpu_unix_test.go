//go:build unix

package server

import (
	"syscall"
	"testing"
)

// cpuNanos is this process's CPU time (user and system) in nanoseconds.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// reportCPU adds cpu-ns/op, the process's CPU time per op since start: on
// a shared machine wall-clock ns/op counts time spent waiting for a core.
func reportCPU(b *testing.B, start int64) {
	b.Helper()
	if start < 0 || b.N == 0 {
		return
	}
	b.ReportMetric(float64(cpuNanos()-start)/float64(b.N), "cpu-ns/op")
}
