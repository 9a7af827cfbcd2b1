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
			r := runPartition(t, d)
			t.Logf("FIGURE partition %v: cut-off node not ready after %v; healed node serves %v after the heal (target up-after+1s = %v); %d writes acknowledged, none lost",
				d, r.notReadyAfter.Round(time.Millisecond), r.serveAfter.Round(time.Millisecond), partUpAfter+time.Second, r.acked)
		})
	}
}
