//go:build !unix

package series

import "testing"

// cpuNanos is unknown here: -1.
func cpuNanos() int64 { return -1 }

// reportCPU adds nothing where process CPU time is unknown.
func reportCPU(*testing.B, int64) {}
