package loadgen

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenserver/tokenserver/client"
)

// leaseRun drives the client SDK with leases on: each call is one
// Limiter.AllowN, served from a local lease when the key is hot. RPCs are
// counted by the SDK's own metrics.
type leaseRun struct {
	lim                           *client.Limiter
	fromLease, fromServer, fromFB atomic.Int64
}

// run is worker.run for lease mode.
func (lb *leaseRun) run(ctx context.Context, w *worker, o Options, keys []string, seed uint64, stop *atomic.Bool) {
	rng := rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano())))
	var fromLease, fromServer, fromFB int64
	defer func() {
		lb.fromLease.Add(fromLease)
		lb.fromServer.Add(fromServer)
		lb.fromFB.Add(fromFB)
	}()
	for !stop.Load() {
		key := keys[rng.IntN(len(keys))]
		t0 := time.Now()
		d, err := lb.lim.AllowN(ctx, key, o.Permits)
		lat := time.Since(t0)
		if err != nil && ctx.Err() != nil {
			return
		}
		w.hist.record(int64(lat))
		w.calls.Add(1)
		if err != nil && !d.Allowed && d.Source != client.SourceFallback {
			w.errors.Add(1)
			if w.firstErr == nil {
				w.firstErr = err
			}
			continue
		}
		switch d.Source {
		case client.SourceLease:
			fromLease++
		case client.SourceServer:
			fromServer++
		default:
			fromFB++
		}
		if d.Allowed {
			w.allowed.Add(1)
		} else {
			w.denied.Add(1)
		}
	}
}

// report puts the SDK's RPC count and decision sources into the summary.
func (lb *leaseRun) report(res *Result, metrics prometheus.Gatherer, elapsed time.Duration) {
	res.FromLease, res.FromServer, res.FromFallback = lb.fromLease.Load(), lb.fromServer.Load(), lb.fromFB.Load()
	if metrics == nil {
		return
	}
	mfs, _ := metrics.Gather()
	var rpcs float64
	for _, mf := range mfs {
		if mf.GetName() != "tokenserver_client_rpcs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" && (l.GetValue() == "AcquireToken" || l.GetValue() == "AcquireTokens" || l.GetValue() == "RefillToken") {
					rpcs += m.GetCounter().GetValue()
				}
			}
		}
	}
	res.RPCsPerSec = round(rpcs/elapsed.Seconds(), 1)
}
