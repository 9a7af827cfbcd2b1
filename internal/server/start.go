package server

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
)

// Options configure Start.
type Options struct {
	// Server configures the gRPC and HTTP side.
	Server Config
	// Raft configures the Raft node; Start fills in AdvertiseGRPC, Health,
	// JoinVia and Join.
	Raft raftfsm.Config
	// Join lists gRPC addresses of members to ask to add this node.
	Join []string
}

// Start opens the listeners and the Raft node and returns a node to Serve.
// Listening first lets ":0" addresses resolve before Raft records them.
func Start(o Options) (*Node, error) {
	sec := &o.Server.Security
	multi := o.Raft.BootstrapExpect > 1 || len(o.Join) > 0 || len(o.Raft.Peers) > 1
	if err := CheckPeers(sec, multi, o.Raft.RaftBind); err != nil {
		return nil, err
	}
	gl, err := net.Listen("tcp", o.Server.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("listen grpc %s: %w", o.Server.GRPCAddr, err)
	}
	var hl net.Listener
	if o.Server.HTTPAddr != "" {
		if hl, err = net.Listen("tcp", o.Server.HTTPAddr); err != nil {
			gl.Close()
			return nil, fmt.Errorf("listen http %s: %w", o.Server.HTTPAddr, err)
		}
	}
	fail := func(err error) (*Node, error) {
		gl.Close()
		if hl != nil {
			hl.Close()
		}
		return nil, err
	}
	if o.Server.AdvertiseGRPC == "" {
		o.Server.AdvertiseGRPC = gl.Addr().String()
	}
	peerServer, peerClient := sec.peerTLS()
	pool := newPeers(peerClient)
	rc := o.Raft
	rc.PeerServerTLS, rc.PeerClientTLS = peerServer, peerClient
	rc.AdvertiseGRPC = o.Server.AdvertiseGRPC
	rc.Health = pool.Health
	rc.JoinVia = pool.JoinVia
	rc.DrainVia = pool.DrainVia
	var self atomic.Pointer[Node] // set once the node exists
	rc.ObserveApply = func(d time.Duration) {
		if n := self.Load(); n != nil {
			n.metrics.apply.Observe(d.Seconds())
		}
	}
	rc.OnCaughtUp = func() {
		if n := self.Load(); n != nil {
			n.updateHealth()
		}
	}
	rc.Join = len(o.Join) > 0
	if rc.Logger == nil {
		rc.Logger = o.Server.Logger
	}
	rn, err := raftfsm.Open(rc)
	if err != nil {
		return fail(err)
	}
	n, err := New(o.Server, rn)
	if err != nil {
		rn.Close()
		return fail(err)
	}
	n.peers = pool
	self.Store(n)
	n.grpcLis, n.httpLis = gl, hl
	if len(o.Join) > 0 {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			go func() { <-n.done; cancel() }()
			if err := rn.JoinCluster(ctx, o.Join); err != nil {
				n.log.Error("could not join the cluster", "via", o.Join, "err", err)
			}
		}()
	}
	return n, nil
}
