package server

import (
	"context"
	"io"
	"time"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// DataPlane is what the data plane reads of the cluster, on every call and
// without a lock: this node's id, the routing view, the leader, readiness
// and the rule table. The Raft node (through RaftCluster) and Standalone
// implement it.
type DataPlane interface {
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
	// Table returns the local rule table. It never returns nil.
	Table() *rule.Table
}

// ControlPlane is what the admin service and the node's lifecycle change
// or ask of the cluster: rule writes and leader reads, membership,
// snapshots and status. Writes on a follower fail with a
// *rule.LeaderError naming the leader, to which the server forwards them.
type ControlPlane interface {
	// Put, Delete, Get and List are rule.Store's (see there).
	Put(ctx context.Context, r *rule.Rule, expected *uint64) (*rule.Rule, error)
	Delete(ctx context.Context, name string, expected *uint64) error
	// PutRequest and DeleteRequest are Put and Delete with the caller's
	// idempotency key: a retry of a write that was committed answers its
	// first result instead of failing its own compare-and-set.
	PutRequest(ctx context.Context, requestID string, r *rule.Rule, expected *uint64) (*rule.Rule, error)
	DeleteRequest(ctx context.Context, requestID, name string, expected *uint64) error
	Get(ctx context.Context, name string) (*rule.Rule, error)
	List(ctx context.Context) ([]*rule.Rule, error)
	// Drain takes this node out of the routing view before it stops;
	// DrainMember does it for another member (on the leader).
	Drain(ctx context.Context) error
	DrainMember(ctx context.Context, id string) error
	// AddMember and RemoveMember change membership (on the leader).
	AddMember(ctx context.Context, id, raftAddr, grpcAddr string) error
	RemoveMember(ctx context.Context, id string) error
	// Status is the node's view of the cluster.
	Status() (Status, error)
	// SnapshotSave opens a snapshot of the state (on the leader).
	SnapshotSave(ctx context.Context) (io.ReadCloser, error)
	// RestoreRules replaces the rule table with a snapshot's (on the
	// leader): the number of rules and the table's version.
	RestoreRules(ctx context.Context, snapshot io.Reader) (int, uint64, error)
	// Close leaves the cluster cleanly (a leader hands over first).
	Close() error
}

// Status is a node's view of the cluster, as the admin service and the
// metrics report it.
type Status struct {
	ID string
	// State is the Raft state: Follower, Candidate, Leader or Shutdown.
	State        string
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	LastIndex    uint64
	// LastContact is when a follower last heard from the leader.
	LastContact time.Time
	Leader      string
	Epoch       uint64
	Draining    bool
	Members     []MemberStatus
}

// MemberStatus is one member of the Raft configuration.
type MemberStatus struct {
	ID       string
	RaftAddr string
	GRPCAddr string
	Voter    bool
	Leader   bool
	// Live means in the routing view.
	Live bool
	// Suffrage is voter, nonvoter or staging (a non-voter autopilot will
	// promote once it is stable).
	Suffrage string
	// Healthy and HealthFor are the leader's last health check of the
	// member and how long it has held; known on the leader only.
	Healthy   bool
	HealthFor time.Duration
	// Stabilization is autopilot's state in words.
	Stabilization string
}
