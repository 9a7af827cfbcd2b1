package server_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	cachetypes "github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/tokenserver/tokenserver/internal/envoyrls/xds"
	"github.com/tokenserver/tokenserver/internal/server"
	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// xdsServer is go-control-plane's own xDS server with a snapshot cache on
// 127.0.0.1:0, as Envoy Gateway runs it.
func xdsServer(t *testing.T) (cache.SnapshotCache, string) {
	t.Helper()
	sc := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(srv, serverv3.NewServer(context.Background(), sc, nil))
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return sc, lis.Addr().String()
}

// pushLimit makes domain "gw" with key "user" at n per hour the snapshot
// of node id, at version.
func pushLimit(t *testing.T, sc cache.SnapshotCache, id, version string, n uint32) {
	t.Helper()
	rc := &rlsconf.RateLimitConfig{Name: "gw-config", Domain: "gw", Descriptors: []*rlsconf.RateLimitDescriptor{{
		Key: "user", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: n},
	}}}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]cachetypes.Resource{resource.RateLimitConfigType: {rc}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.SetSnapshot(context.Background(), id, snap); err != nil {
		t.Fatal(err)
	}
}

// TestEnvoyXDSCluster: a three-node cluster started with the --envoy-xds-*
// configuration serves the snapshot go-control-plane's server pushes, on
// every node, with the xDS server as the domain's author; a changed
// snapshot replaces it everywhere.
func TestEnvoyXDSCluster(t *testing.T) {
	sc, addr := xdsServer(t)
	const nodeID = "tokenserver-ratelimit"
	pushLimit(t, sc, nodeID, "v1", 2)
	c := testcluster.NewWith(t, 3, func(o *server.Options) {
		o.Server.Envoy.XDS = xds.Config{Server: addr, NodeID: nodeID,
			Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clients := make([]rlpb.RateLimitServiceClient, len(c.Nodes))
	for i, n := range c.Nodes {
		clients[i] = rlsClient(t, n.GRPCAddr)
	}
	// limitOn is the limit node i answers for a fresh user value (0: none).
	call := 0
	limitOn := func(i int) uint32 {
		call++
		resp, err := clients[i].ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "gw",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", fmt.Sprint("fresh-", call))}})
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	for _, want := range []struct {
		version string
		limit   uint32
	}{{"v1", 2}, {"v2", 5}} {
		if want.version != "v1" {
			pushLimit(t, sc, nodeID, want.version, want.limit)
		}
		for i := range c.Nodes {
			c.WaitFor("xds "+want.version+" on "+c.Nodes[i].ID, func() bool { return limitOn(i) == want.limit })
		}
	}
	list, err := c.Nodes[1].Admin().ListEnvoyDomains(ctx, &pb.ListEnvoyDomainsRequest{})
	if err != nil || len(list.GetDomains()) != 1 || list.GetDomains()[0].GetAuthor() != "xds:"+addr {
		t.Fatalf("list: %v %v, want domain gw by xds:%s", list, err, addr)
	}
	// Six calls of one user: only the sixth is over the limit of 5, counted on the owner whichever node is asked.
	req := &rlpb.RateLimitRequest{Domain: "gw", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "same")}}
	for k := 0; k < 6; k++ {
		resp, err := clients[k%3].ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if over := resp.GetOverallCode() == rlpb.RateLimitResponse_OVER_LIMIT; over != (k == 5) {
			t.Fatalf("call %d: %v", k, resp)
		}
	}
}
