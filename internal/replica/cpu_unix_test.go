//go:build unix

package replica

import "syscall"

// cpuNanos is this process's CPU time (user and system) in nanoseconds:
// on a shared machine wall-clock time counts time spent waiting for a
// core.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
