//go:build multiprocess && figures

package e2e

import (
	"fmt"
	"testing"
	"time"
)

// TestFiguresPartition measures the healed node's time to serve after
// 60 s and 120 s partitions (issue 20, item 15's figures).
func TestFiguresPartition(t *testing.T) {
	for _, d := range []time.Duration{60 * time.Second, 120 * time.Second} {
		t.Run(fmt.Sprint(d), func(t *testing.T) {
			logPartitionFigure(t, d, runPartition(t, d))
		})
	}
}
