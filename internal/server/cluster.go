package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Cluster is what a node needs of its rule store and membership: the Raft
// node of internal/raftfsm, or Standalone for a node without Raft.
type Cluster interface {
	rule.Store
	// ID is this node's id.
	ID() string
	// View is the routing view; ViewChanged is closed when it changes.
	View() *cluster.View
	ViewChanged() <-chan struct{}
	// Leader is the leader's id and gRPC address, "" when unknown.
	Leader() (id, grpcAddr string)
	// Ready reports whether the node has caught up, is in the routing view
	// and is not draining.
	Ready() bool
	// CaughtUp reports whether the node has applied the log up to the
	// commit index it learned after start (what the leader's member
	// health check asks before it puts the node in the view).
	CaughtUp() bool
	// Drain takes this node out of the routing view before it stops;
	// DrainMember does it for another member (on the leader; else a
	// *rule.LeaderError).
	Drain(ctx context.Context) error
	DrainMember(ctx context.Context, id string) error
	// AddMember and RemoveMember change membership (on the leader; else a
	// *rule.LeaderError).
	AddMember(ctx context.Context, id, raftAddr, grpcAddr string) error
	RemoveMember(ctx context.Context, id string) error
	// Status is the node's view of the cluster.
	Status() (raftfsm.Status, error)
	// SnapshotSave opens a snapshot of the state (on the leader).
	SnapshotSave(ctx context.Context) (io.ReadCloser, error)
	// RestoreRules replaces the rule table with a snapshot's (on the leader).
	RestoreRules(ctx context.Context, snapshot io.Reader) (int, uint64, error)
	// Close leaves the cluster cleanly (a leader hands over first).
	Close() error
}

var _ Cluster = (*raftfsm.Node)(nil)

// ForwardedHeader marks a request forwarded by another node: it is served
// where it lands and never forwarded again.
const ForwardedHeader = "x-tokenserver-forwarded"

// forwarded reports whether the call came from another node.
func forwarded(ctx context.Context) bool {
	// ValueFromIncomingContext reads one header without copying the whole
	// metadata map (FromIncomingContext's copy cost ~5% of a call's CPU).
	return len(metadata.ValueFromIncomingContext(ctx, ForwardedHeader)) > 0
}

// markForwarded returns ctx (with its deadline) for a call to another node.
func markForwarded(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, ForwardedHeader, "1")
}

// Standalone is a Cluster of one node over a rule.Store without Raft: its
// view is itself, it always leads and is ready. Tests use it with a
// rule.MemStore.
type Standalone struct {
	rule.Store
	id, grpcAddr string
	view         *cluster.View
	never        chan struct{}
}

// NewStandalone returns a one-node Cluster over store.
func NewStandalone(id, grpcAddr string, store rule.Store) *Standalone {
	return &Standalone{Store: store, id: id, grpcAddr: grpcAddr,
		view:  cluster.NewView(1, []cluster.Member{{ID: id, GRPCAddr: grpcAddr, Voter: true}}),
		never: make(chan struct{})}
}

// ID implements Cluster.
func (s *Standalone) ID() string { return s.id }

// View implements Cluster.
func (s *Standalone) View() *cluster.View { return s.view }

// ViewChanged implements Cluster: the view never changes.
func (s *Standalone) ViewChanged() <-chan struct{} { return s.never }

// Leader implements Cluster.
func (s *Standalone) Leader() (string, string) { return s.id, s.grpcAddr }

// Ready implements Cluster.
func (s *Standalone) Ready() bool { return true }

// CaughtUp implements Cluster.
func (s *Standalone) CaughtUp() bool { return true }

// Drain implements Cluster: a standalone node owns every key; there is
// nowhere to move them.
func (s *Standalone) Drain(context.Context) error { return nil }

// DrainMember implements Cluster.
func (s *Standalone) DrainMember(context.Context, string) error {
	return status.Error(codes.FailedPrecondition, "this node runs without Raft and has no members")
}

// AddMember implements Cluster: a standalone node has no members to add.
func (s *Standalone) AddMember(context.Context, string, string, string) error {
	return status.Error(codes.FailedPrecondition, "this node runs without Raft and cannot take members")
}

// RemoveMember implements Cluster.
func (s *Standalone) RemoveMember(context.Context, string) error {
	return status.Error(codes.FailedPrecondition, "this node runs without Raft and has no members")
}

// Status implements Cluster.
func (s *Standalone) Status() (raftfsm.Status, error) {
	t := s.Table()
	return raftfsm.Status{ID: s.id, State: "Leader", CommitIndex: t.Version, AppliedIndex: t.Version, LastIndex: t.Version,
		Leader: s.id, Epoch: 1, Members: []raftfsm.MemberStatus{{ID: s.id, GRPCAddr: s.grpcAddr, Voter: true, Leader: true, Live: true}}}, nil
}

// Close implements Cluster.
func (s *Standalone) Close() error { return nil }

// SnapshotSave implements Cluster: the rules in the snapshot format.
func (s *Standalone) SnapshotSave(context.Context) (io.ReadCloser, error) {
	t := s.Table()
	rules := map[string]*rule.Rule{}
	for _, r := range t.Rules() {
		rules[r.Name] = r
	}
	b, err := json.Marshal(map[string]any{"index": t.Version, "rules": rules})
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// RestoreRules implements Cluster: a standalone node cannot replace its
// table in one step.
func (s *Standalone) RestoreRules(context.Context, io.Reader) (int, uint64, error) {
	return 0, 0, status.Error(codes.FailedPrecondition, "this node runs without Raft and cannot restore a snapshot")
}

// peers keeps one client connection per other node, for forwarding, health
// checks and joins.
type peers struct {
	creds  credentials.TransportCredentials
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
}

// newPeers returns a pool that dials with mutual TLS over tlsCfg
// (tlsutil.Reloader.PeerClientConfig), or plain TCP when it is nil.
func newPeers(tlsCfg *tls.Config) *peers {
	return &peers{creds: peerDialCreds(tlsCfg), conns: map[string]*grpc.ClientConn{}}
}

// conn returns the connection to addr, creating it on first use.
func (p *peers) conn(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, status.Error(codes.Unavailable, "node is shutting down")
	}
	if c, ok := p.conns[addr]; ok {
		return c, nil
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(p.creds),
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

// MemberHealthService is the gRPC health service name a node reports
// SERVING under once it has caught up with the Raft log and while it is not
// draining: the leader's check before it puts the node in the routing view
// (the node's overall health, "", also needs it to be in the view).
const MemberHealthService = "tokenserver.v1.Member"

// Health reports whether the node at addr answers its member health check
// as serving within ctx.
func (p *peers) Health(ctx context.Context, addr string) bool {
	c, err := p.conn(addr)
	if err != nil {
		return false
	}
	resp, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{Service: MemberHealthService})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// DrainVia asks the leader at addr to take member id out of the view.
func (p *peers) DrainVia(ctx context.Context, addr, id string) error {
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
func (p *peers) JoinVia(ctx context.Context, addrs []string, self cluster.Member) error {
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

// close closes every connection.
func (p *peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// peerError turns a failed call to another node into the status the caller
// sees: the node's own status, or Unavailable when it could not be reached.
func peerError(who string, err error) error {
	s, ok := status.FromError(err)
	if !ok {
		return status.Errorf(codes.Unavailable, "%s: %v", who, err)
	}
	if s.Code() == codes.Unavailable || s.Code() == codes.Unknown {
		return status.Errorf(codes.Unavailable, "%s is unreachable: %s", who, s.Message())
	}
	return err
}
