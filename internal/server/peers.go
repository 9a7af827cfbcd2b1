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
	"github.com/tokenserver/tokenserver/internal/netutil"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Peers keeps one client connection per other node, for forwarding,
// health checks, drains and joins, and what this node learned of the
// health of members that callers avoid. The Raft node uses its Health,
// JoinVia and DrainVia (see OpenRaft). It is safe for simultaneous use.
type Peers struct {
	creds credentials.TransportCredentials
	// forID, when set, is the config to dial node id with, checking that
	// the server's certificate names it (tlsutil.Reloader.PeerClientConfigFor).
	forID  func(id string) (*tls.Config, error)
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool

	healthMu sync.Mutex
	health   map[string]*peerState // by member id
}

// peerState is what a node learned of one member callers avoid.
type peerState struct {
	healthy bool // the last check answered SERVING
	checked time.Time
	// started is when the check that set healthy began.
	started time.Time
	// inflight is closed when the check under way ends; nil when none is.
	inflight chan struct{}
}

// How often, and how long, a node checks a member that callers avoid.
const (
	peerCheckInterval = time.Second
	peerCheckTimeout  = 300 * time.Millisecond
	// peerDownFor is how long a failed check answers Peers.down while
	// newer checks run.
	peerDownFor = 5 * peerCheckInterval
)

// NewPeers returns a pool that dials with mutual TLS over tlsCfg
// (tlsutil.Reloader.PeerClientConfig), or plain TCP when it is nil.
func NewPeers(tlsCfg *tls.Config) *Peers {
	return &Peers{creds: peerDialCreds(tlsCfg), conns: map[string]*grpc.ClientConn{}, health: map[string]*peerState{}}
}

// expectIDs makes the connections to a known member check that the
// server's certificate names that member (see connTo), when peers talk
// TLS.
func (p *Peers) expectIDs(sec *Security) {
	if _, cli := sec.peerTLS(); cli != nil {
		p.forID = sec.TLS.PeerClientConfigFor
	}
}

// conn returns the connection to addr, creating it on first use; the
// server's certificate must be a node's, any node's.
func (p *Peers) conn(addr string) (*grpc.ClientConn, error) { return p.connTo("", addr) }

// connTo is conn to member id at addr: with peer TLS, the server's
// certificate must also name id, so that a member's address taken over by
// another node's certificate is refused. id "" checks no id.
func (p *Peers) connTo(id, addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, failf(ErrUnavailable, "node is shutting down")
	}
	key, creds := addr, p.creds
	if id != "" && p.forID != nil {
		key = id + "@" + addr
		cfg, err := p.forID(id)
		if err != nil {
			return nil, fmt.Errorf("dial %s at %s: %w", id, addr, err)
		}
		creds = credentials.NewTLS(cfg)
	}
	if c, ok := p.conns[key]; ok {
		return c, nil
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), grpc.WithUnaryInterceptor(InjectTraceContext),
		// TCP keepalive and a user timeout: a peer that went silent (a
		// partition) is noticed in seconds, not after TCP's retransmission
		// backoff, so a healed node is dialled again at once.
		grpc.WithContextDialer(netutil.ContextDialer(netutil.DefaultOptions())),
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
	p.conns[key] = c
	return c, nil
}

// Health reports whether the node at addr answers its member health check
// as serving within ctx.
func (p *Peers) Health(ctx context.Context, addr string) bool { return p.healthOf(ctx, "", addr) }

// healthOf is Health of member id at addr (see connTo).
func (p *Peers) healthOf(ctx context.Context, id, addr string) bool {
	c, err := p.connTo(id, addr)
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

// RemoveVia asks the leader at addr to remove member id (a leader that
// removes itself hands over first, then asks the new leader).
func (p *Peers) RemoveVia(ctx context.Context, addr, id string) error {
	c, err := p.conn(addr)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pb.NewAdminServiceClient(c).RemoveMember(markForwarded(cctx), &pb.RemoveMemberRequest{Id: id})
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
	st := p.stateLocked(m)
	return !st.healthy
}

// down reports whether member m is down as this node sees it: its member
// health check, from this node, did not answer SERVING. Unlike avoidable
// it takes no claim on trust, and no answer older than the claim either: a
// call that could not reach m says something may have changed a moment ago
// (a kill -9 a millisecond before), so only a check that began after down
// was asked can say m is up. down waits for one (at most peerCheckTimeout
// each, and ctx); a check it could not wait for counts as "not down". A
// failed check stays an answer for peerDownFor while the next one runs,
// so that calls for a dead member's keys do not each wait for a check. A
// next owner asks it before it decides a key whose owner a forwarding node
// (or this one) could not reach (see route, nextOwner): that broken
// connection is no proof, and a check from before it is none either.
func (p *Peers) down(ctx context.Context, m cluster.Member) bool {
	asked := time.Now()
	for {
		p.healthMu.Lock()
		st := p.stateLocked(m)
		if !st.checked.IsZero() && !st.healthy && time.Since(st.checked) <= peerDownFor {
			p.healthMu.Unlock()
			return true
		}
		if !st.checked.IsZero() && !st.started.Before(asked) {
			healthy := st.healthy // a check that began after down was asked
			p.healthMu.Unlock()
			return !healthy
		}
		if st.inflight == nil {
			p.startCheckLocked(m, st)
		}
		wait := st.inflight
		p.healthMu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return false
		}
	}
}

// stateLocked returns what this node learned of m, starting a check in
// the background when the last one is older than peerCheckInterval and
// none is under way; p.healthMu is held.
func (p *Peers) stateLocked(m cluster.Member) *peerState {
	st := p.health[m.ID]
	if st == nil {
		st = &peerState{}
		p.health[m.ID] = st
	}
	if st.inflight == nil && time.Since(st.checked) > peerCheckInterval {
		p.startCheckLocked(m, st)
	}
	return st
}

// startCheckLocked starts a health check of m in the background; none is
// under way, and p.healthMu is held.
func (p *Peers) startCheckLocked(m cluster.Member, st *peerState) {
	done := make(chan struct{})
	began := time.Now()
	st.inflight = done
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), peerCheckTimeout)
		ok := p.healthOf(ctx, m.ID, m.GRPCAddr)
		cancel()
		p.healthMu.Lock()
		st.healthy, st.checked, st.started, st.inflight = ok, time.Now(), began, nil
		p.healthMu.Unlock()
		close(done)
	}()
}

// close closes every connection, all at once: closing one waits for its
// writer (up to gRPC's GOAWAY timeout on a connection that a frozen peer
// no longer reads), and one such peer must not hold up the others. The
// caller bounds the wait (Node.Stop).
func (p *Peers) close() {
	p.mu.Lock()
	p.closed = true
	conns := make([]*grpc.ClientConn, 0, len(p.conns))
	for _, c := range p.conns {
		conns = append(conns, c)
	}
	clear(p.conns)
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { c.Close() })
	}
	wg.Wait()
}
