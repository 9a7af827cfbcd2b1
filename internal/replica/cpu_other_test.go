//go:build !unix

package replica

// cpuNanos is not measured here.
func cpuNanos() int64 { return -1 }
