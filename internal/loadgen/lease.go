package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenserver/tokenserver/client"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// leaseBench drives the client SDK with leases on: each call is one
// Limiter.AllowN, served from a local lease when the key is hot. RPCs are
// counted by the SDK's own metrics.
type leaseBench struct {
	c                             *client.Client
	lim                           *client.Limiter
	reg                           *prometheus.Registry
	fromLease, fromServer, fromFB atomic.Int64
}

func (a *app) newLeaseBench(ctx context.Context, o benchOpts, rule *pb.Rule) (*leaseBench, error) {
	if rule.GetLease().GetMaxBatch() == 0 {
		return nil, usagef("rule %q allows no leases (set --lease-max and --lease-ttl on the rule)", o.rule)
	}
	lb := &leaseBench{reg: prometheus.NewRegistry()}
	sec, err := a.sec.clientOptions()
	if err != nil {
		return nil, err
	}
	c, err := client.New(ctx, []string{a.server}, append(sec, client.WithMetrics(lb.reg), client.WithCallTimeout(time.Second))...)
	if err != nil {
		return nil, fmt.Errorf("bench: client: %w", err)
	}
	lb.c = c
	lb.lim = c.Limiter(o.rule, client.WithLease(o.leaseMax, o.leaseTTL))
	return lb, nil
}

// run is benchWorker.run for lease mode.
func (lb *leaseBench) run(w *benchWorker, ctx context.Context, o benchOpts, keys []string, seed uint64, stop *atomic.Bool) {
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
		d, err := lb.lim.AllowN(ctx, key, o.permits)
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
func (lb *leaseBench) report(res *benchResult, elapsed time.Duration) {
	mfs, _ := lb.reg.Gather()
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
	res.FromLease, res.FromServer, res.FromFallback = lb.fromLease.Load(), lb.fromServer.Load(), lb.fromFB.Load()
}

func (lb *leaseBench) close() { lb.c.Close() }
