package client

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/server"
)

// TestBlackholedServer puts a TCP proxy (toxiproxy as a library) between the
// SDK and a node, and makes the connection swallow every byte without
// closing: unlike a refused connection, nothing ever fails fast. Calls still
// return within their deadline (plus slack), the SDK goes to the rule's
// LOCAL fallback and keeps its limit, and it returns to the server once the
// connection heals.
func TestBlackholedServer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	proxy := toxiproxy.NewProxy(api, "node", "127.0.0.1:0", lis.Addr().String())
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	defer proxy.Stop()
	// The node advertises the proxy, so the SDK routes through it.
	store, err := raftfsm.NewInmem("solo", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	cfg := server.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr = proxy.Listen, ""
	node, err := server.New(cfg, server.NewStandalone("solo", proxy.Listen, store).Deps())
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	node.RegisterServices(gs)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = gs.Serve(lis) }()
	defer func() { gs.Stop(); wg.Wait(); node.Stop() }()

	r := tokenBucket("bh", 1000, time.Second, 1000)
	r.Fallback = rule.Fallback{Policy: rule.FallbackLocal, Limit: 3}
	if _, err := store.Put(context.Background(), r, nil); err != nil {
		t.Fatal(err)
	}
	const deadline = 50 * time.Millisecond
	c, _ := newClient(t, []string{proxy.Listen}, WithCallTimeout(deadline))
	waitRule(t, c, "bh")
	lim := c.Limiter("bh")
	if d, err := lim.AllowN(context.Background(), "k", 1); err != nil || d.Source != SourceServer {
		t.Fatalf("before the fault: %+v %v", d, err)
	}

	for _, stream := range []string{"upstream", "downstream"} {
		if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"hole-` + stream + `","type":"timeout","stream":"` + stream + `","attributes":{"timeout":0}}`)); err != nil {
			t.Fatal(err)
		}
	}
	allowed := 0
	var slowest time.Duration
	for i := 0; i < 8; i++ {
		start := time.Now()
		d, _ := lim.AllowN(context.Background(), "k", 1)
		slowest = max(slowest, time.Since(start))
		if d.Allowed {
			if d.Source != SourceFallback {
				t.Fatalf("call %d allowed by %v through a blackhole", i, d.Source)
			}
			allowed++
		}
	}
	t.Logf("blackholed: slowest call %v (deadline %v), fallback admitted %d (LOCAL limit 3)", slowest, deadline, allowed)
	if slowest > deadline+250*time.Millisecond {
		t.Fatalf("a call took %v through a blackhole, deadline %v", slowest, deadline)
	}
	if allowed > 3 || !c.InFallback() {
		t.Fatalf("fallback admitted %d (limit 3); in fallback %v", allowed, c.InFallback())
	}

	proxy.Toxics.ResetToxics(context.Background())
	took := waitFor(t, 20*time.Second, "back on the server after the heal", func() bool {
		d, err := lim.AllowN(context.Background(), "k2", 1)
		return err == nil && d.Source == SourceServer && !c.InFallback()
	})
	t.Logf("back on the server %v after the heal", took)
}
