package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tokenserver/tokenserver/internal/cluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Peers keeps one client connection per other node, for forwarding,
// health checks, drains and joins, and what this node learned of the
// health of members that callers avoid. The Raft node uses its Health,
// JoinVia and DrainVia (see OpenRaft). It is safe for simultaneous use.
type Peers struct {
	creds  credentials.TransportCredentials
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool

	healthMu sync.Mutex
	health   map[string]*peerState // by member id
}

// peerState is what a node learned of one member callers avoid.
type peerState struct {
	healthy  bool // the last check answered SERVING
	checked  time.Time
	checking bool
}

// How often, and how long, a node checks a member that callers avoid.
const (
	peerCheckInterval = time.Second
	peerCheckTimeout  = 300 * time.Millisecond
)

// NewPeers returns a pool that dials with mutual TLS over tlsCfg
// (tlsutil.Reloader.PeerClientConfig), or plain TCP when it is nil.
func NewPeers(tlsCfg *tls.Config) *Peers {
	return &Peers{creds: peerDialCreds(tlsCfg), conns: map[string]*grpc.ClientConn{}, health: map[string]*peerState{}}
}

// conn returns the connection to addr, creating it on first use.
func (p *Peers) conn(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, failf(ErrUnavailable, "node is shutting down")
	}
	if c, ok := p.conns[addr]; ok {
		return c, nil
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(p.creds), grpc.WithUnaryInterceptor(InjectTraceContext),
		// A node back after an outage must be reachable again within a
		// second or so, not after gRPC's default backoff of up to 120 s:
		// the view takes it back --up-after after its health check passes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	p.conns[addr] = c
	return c, nil
}

// Health reports whether the node at addr answers its member health check
// as serving within ctx.
func (p *Peers) Health(ctx context.Context, addr string) bool {
	c, err := p.conn(addr)
	if err != nil {
		return false
	}
	resp, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{Service: MemberHealthService})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// DrainVia asks the leader at addr to take member id out of the view.
func (p *Peers) DrainVia(ctx context.Context, addr, id string) error {
	c, err := p.conn(addr)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pb.NewAdminServiceClient(c).DrainMember(markForwarded(cctx), &pb.DrainMemberRequest{Id: id})
	return err
}

// JoinVia asks the nodes at addrs, in turn, to add self.
func (p *Peers) JoinVia(ctx context.Context, addrs []string, self cluster.Member) error {
	var errs []error
	for _, a := range addrs {
		c, err := p.conn(a)
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = pb.NewAdminServiceClient(c).JoinCluster(cctx, &pb.JoinClusterRequest{Id: self.ID, RaftAddr: self.RaftAddr, GrpcAddr: self.GRPCAddr})
			cancel()
		}
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("join via %s: %w", a, err))
	}
	return errors.Join(errs...)
}

// avoidable reports whether this node believes a caller that says member m
// cannot be reached: m's last health check from here failed, or none has
// answered yet. A claim about m with no check in the last
// peerCheckInterval starts one in the background. So a caller that names a
// healthy member to get a second bucket for its keys gains at most the
// calls before the check answers; a frozen, dead or not-ready member is
// avoided from the first call.
func (p *Peers) avoidable(m cluster.Member) bool {
	p.healthMu.Lock()
	defer p.healthMu.Unlock()
	st := p.health[m.ID]
	if st == nil {
		st = &peerState{}
		p.health[m.ID] = st
	}
	if !st.checking && time.Since(st.checked) > peerCheckInterval {
		st.checking = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), peerCheckTimeout)
			ok := p.Health(ctx, m.GRPCAddr)
			cancel()
			p.healthMu.Lock()
			st.healthy, st.checked, st.checking = ok, time.Now(), false
			p.healthMu.Unlock()
		}()
	}
	return !st.healthy
}

// close closes every connection.
func (p *Peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}
