//go:build multiprocess && figures

package e2e

// The figures of the lifecycle issue, on real processes: `make figures`.

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestFiguresSimultaneousStarts: 20 simultaneous starts of 3
// --bootstrap-expect processes; panics and failures per try.
func TestFiguresSimultaneousStarts(t *testing.T) {
	var times []time.Duration
	panics := 0
	for i := 0; i < 20; i++ {
		t.Run(fmt.Sprint("try", i), func(t *testing.T) {
			start := time.Now()
			c := newProcCluster(t, 3)
			times = append(times, time.Since(start))
			for _, id := range c.ids {
				if strings.Contains(c.procs[id].logs.String(), "panic") {
					panics++
				}
			}
		})
	}
	t.Logf("FIGURE simultaneous starts: %d of 20 formed a cluster, %d panics; start to a view of 3: p50 %v, max %v",
		len(times), panics, pct(times, 0.5).Round(time.Millisecond), pct(times, 1).Round(time.Millisecond))
}

// TestFiguresFollowerRestart: SIGTERM a follower, start it, time to /readyz
// with nothing written meanwhile; 10 restarts.
func TestFiguresFollowerRestart(t *testing.T) {
	c := newProcCluster(t, 3)
	var took []time.Duration
	for i := 0; i < 10; i++ {
		leader := c.leader("")
		var f string
		for _, id := range c.ids {
			if id != leader {
				f = id
				break
			}
		}
		c.stop(f)
		start := time.Now()
		c.start(f)
		addr := c.procs[f].httpAddr
		c.waitFor("ready", 30*time.Second, func() bool { return readyz(addr) })
		took = append(took, time.Since(start))
		c.waitFor("a view of 3", 30*time.Second, func() bool { return c.liveCount() == 3 })
	}
	t.Logf("FIGURE follower restart to /readyz: p50 %v, max %v (10 restarts)", pct(took, 0.5).Round(time.Millisecond), pct(took, 1).Round(time.Millisecond))
}

// TestFiguresOutageReturn: a node down for 2 minutes, back in the view
// after its start (--up-after 3s).
func TestFiguresOutageReturn(t *testing.T) {
	c := newProcCluster(t, 3)
	took := outageReturn(t, c, 2*time.Minute)
	t.Logf("FIGURE back in the view %v after a start that ended a 2-minute outage (--up-after 3s)", took.Round(time.Millisecond))
}
