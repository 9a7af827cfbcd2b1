package raftfsm

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// Peer is one member of a --bootstrap-expect cluster.
type Peer struct {
	ID       string
	RaftAddr string
}

// Config configures a Raft node. Start from DefaultConfig.
type Config struct {
	// NodeID is the Raft server id.
	NodeID string
	// DataDir holds raft.db (log and stable store) and snapshots/.
	DataDir string
	// RaftBind is the Raft listen address.
	RaftBind string
	// RaftListener, when set, is the Raft listener, bound by the caller
	// (RaftBind is then unused): tests bind 127.0.0.1:0 and keep the
	// listener, so no other process takes the port in between.
	RaftListener net.Listener
	// AdvertiseRaft is the Raft address others dial (default: RaftBind's).
	AdvertiseRaft string
	// AdvertiseGRPC is this node's gRPC address, recorded in the FSM so that
	// others route to it.
	AdvertiseGRPC string
	// BootstrapExpect, with Peers, bootstraps a cluster of that many nodes
	// once all are reachable and none has state.
	BootstrapExpect int
	// Peers are the --bootstrap-expect members, this node among them.
	Peers []Peer
	// Join means the node was given --join: it never bootstraps.
	Join bool
	// HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout and
	// CommitTimeout are Raft's timeouts. LeaderLeaseTimeout is also how
	// soon a leader that has lost contact with a quorum of voters steps
	// down (raft's check quorum): it must be positive and at most
	// HeartbeatTimeout.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// SnapshotThreshold is the number of log entries between snapshots.
	SnapshotThreshold uint64
	// SnapshotInterval is how often Raft checks whether to snapshot.
	SnapshotInterval time.Duration
	// MaxVoters is the most voting members; more stay non-voters.
	MaxVoters int
	// StabilizationTime is how long a joining node must stay healthy (caught
	// up, answering its health check) as a non-voter before it is promoted
	// to voter; a member id that rejoins with another address replaces the
	// old member only when that one has been unreachable this long.
	StabilizationTime time.Duration
	// DeadMemberAfter removes a non-voter that has been unreachable this
	// long from the Raft configuration (0: never), as Consul's autopilot
	// cleans up dead servers.
	DeadMemberAfter time.Duration
	// CleanupDeadVoters also removes voters unreachable for DeadMemberAfter,
	// when the voters left keep a healthy quorum.
	CleanupDeadVoters bool
	// DownAfter drops a member from the routing view after this long
	// unhealthy.
	DownAfter time.Duration
	// UpAfter brings a dropped member back after this long healthy.
	UpAfter time.Duration
	// LivenessInterval is how often the leader checks the members.
	LivenessInterval time.Duration
	// Health checks a member's gRPC health (it must return within ctx).
	Health func(ctx context.Context, grpcAddr string) bool
	// JoinVia asks a member at one of grpcAddrs to add self (gRPC
	// AdminService.Join), which also records self's addresses.
	JoinVia func(ctx context.Context, grpcAddrs []string, self cluster.Member) error
	// RemoveVia asks the leader, at its gRPC address, to remove member id
	// (AdminService.RemoveMember): a leader asked to remove itself hands
	// leadership over, then asks the new leader. Nil: RemoveMember returns
	// the new leader's *rule.LeaderError for the caller to forward.
	RemoveVia func(ctx context.Context, leaderGRPC, id string) error
	// DrainVia asks the leader, at its gRPC address, to take member id out
	// of the routing view (AdminService.DrainMember); nil means this node
	// can leave the view only while it leads.
	DrainVia func(ctx context.Context, leaderGRPC, id string) error
	// OnCaughtUp, when set, is called once the node has caught up with the
	// log, before it registers for the view (the server reports its member
	// health there, which the leader checks next).
	OnCaughtUp func()
	// Logger receives the node's and Raft's logs.
	Logger *slog.Logger
	// ObserveApply, when set, receives the time each entry this node
	// proposed took to commit and apply.
	ObserveApply func(time.Duration)
	// Dial, when set, replaces plain TCP for reaching other nodes' Raft
	// addresses (tests route it through fault-injecting proxies).
	Dial func(address string, timeout time.Duration) (net.Conn, error)
	// MaxRules caps the rules of the cluster (0: rule.DefaultMaxRules). A
	// rule write carries the cap of the node that proposes it, so the
	// leader's value applies on every replica.
	MaxRules int
	// MaxRuleTableBytes caps the rule table's total size, the sum of the
	// rules' rule.Rule.EncodedSize (0: DefaultMaxRuleTableBytes). Like
	// MaxRules it travels in each rule write, so the leader's value
	// applies on every replica. The server's flag is
	// --max-rule-table-bytes.
	MaxRuleTableBytes int64
	// InMemory runs Raft over raft's in-memory log, stable and snapshot
	// stores and transport: one node that bootstraps itself, with no
	// files and no listener, for tests of other packages (see NewInmem).
	// DataDir, RaftBind, Health and JoinVia are not needed.
	InMemory bool
	// PeerServerTLS and PeerClientTLS, both or neither, make the Raft port
	// and the node's Raft dials mutual TLS against the peer CA
	// (tlsutil.Reloader's PeerServerConfig and PeerClientConfig): a
	// connection without a peer certificate is refused before one Raft
	// byte is read. Neither: plain TCP.
	PeerServerTLS, PeerClientTLS *tls.Config
}

// DefaultMaxRuleTableBytes is the default cap on the rule table's bytes:
// 64 MiB, some 64 rules at the 1 MiB rule cap or 10,000 rules of 6 KiB.
const DefaultMaxRuleTableBytes = 64 << 20

// maxTableBytes is the byte cap a write carries.
func (c *Config) maxTableBytes() int64 {
	if c.MaxRuleTableBytes > 0 {
		return c.MaxRuleTableBytes
	}
	return DefaultMaxRuleTableBytes
}

// DefaultConfig has production timeouts: a new leader within about 3 s of
// losing the old one.
func DefaultConfig() Config {
	return Config{
		RaftBind:           "127.0.0.1:7071",
		HeartbeatTimeout:   time.Second,
		ElectionTimeout:    time.Second,
		LeaderLeaseTimeout: 500 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		SnapshotThreshold:  8192,
		SnapshotInterval:   2 * time.Minute,
		MaxVoters:          5,
		StabilizationTime:  10 * time.Second,
		DeadMemberAfter:    24 * time.Hour,
		DownAfter:          5 * time.Second,
		UpAfter:            10 * time.Second,
		LivenessInterval:   500 * time.Millisecond,
	}
}

// FastTimeouts sets the in-process test timeouts: heartbeat and election
// 500 ms, leader lease 250 ms (shorter leases lost leadership on loaded
// 2-core machines under -race).
func (c *Config) FastTimeouts() {
	c.HeartbeatTimeout = 500 * time.Millisecond
	c.ElectionTimeout = 500 * time.Millisecond
	c.LeaderLeaseTimeout = 250 * time.Millisecond
	c.CommitTimeout = 20 * time.Millisecond
}

// maxRules is the rule cap a write carries: MaxRules, else
// rule.DefaultMaxRules.
func (c *Config) maxRules() int {
	return cmp.Or(c.MaxRules, rule.DefaultMaxRules)
}

// Validate reports the first problem with c, naming the field.
func (c *Config) Validate() error {
	if c.InMemory {
		switch {
		case c.NodeID == "":
			return errors.New("node id is empty")
		case c.MaxRules < 0:
			return fmt.Errorf("max rules must be >= 0, got %d", c.MaxRules)
		case c.MaxRuleTableBytes < 0:
			return fmt.Errorf("max rule table bytes must be >= 0, got %d", c.MaxRuleTableBytes)
		case c.BootstrapExpect > 0 || c.Join || len(c.Peers) > 0:
			return errors.New("an in-memory node is a cluster of one: no bootstrap-expect, peers or join")
		}
		return nil
	}
	switch {
	case c.NodeID == "":
		return errors.New("node id is empty")
	case c.MaxRules < 0:
		return fmt.Errorf("max rules must be >= 0, got %d", c.MaxRules)
	case c.MaxRuleTableBytes < 0:
		return fmt.Errorf("max rule table bytes must be >= 0, got %d", c.MaxRuleTableBytes)
	case c.DataDir == "":
		return errors.New("data dir is empty")
	case c.RaftBind == "" && c.RaftListener == nil:
		return errors.New("raft address is empty")
	case c.AdvertiseGRPC == "":
		return errors.New("advertised grpc address is empty")
	case c.BootstrapExpect < 0:
		return fmt.Errorf("bootstrap-expect must be >= 0, got %d", c.BootstrapExpect)
	case c.BootstrapExpect > 0 && c.Join:
		return errors.New("bootstrap-expect and join exclude each other")
	case c.BootstrapExpect > 0 && len(c.Peers) != c.BootstrapExpect:
		return fmt.Errorf("bootstrap-expect is %d but %d peers are listed", c.BootstrapExpect, len(c.Peers))
	case c.LeaderLeaseTimeout <= 0 || c.LeaderLeaseTimeout > c.HeartbeatTimeout:
		return fmt.Errorf("leader lease timeout must be in (0, heartbeat timeout %v], got %v: a leader cut off from its quorum steps down after it", c.HeartbeatTimeout, c.LeaderLeaseTimeout)
	case c.MaxVoters < 1:
		return fmt.Errorf("max voters must be >= 1, got %d", c.MaxVoters)
	case c.StabilizationTime < 0:
		return fmt.Errorf("stabilization time must be >= 0, got %v", c.StabilizationTime)
	case c.DeadMemberAfter < 0:
		return fmt.Errorf("dead member cleanup must be >= 0, got %v", c.DeadMemberAfter)
	case c.CleanupDeadVoters && c.DeadMemberAfter == 0:
		return errors.New("cleaning up dead voters needs a dead member time")
	case c.Health == nil || c.JoinVia == nil:
		return errors.New("health and join functions are required")
	}
	if c.BootstrapExpect > 0 && !slices.ContainsFunc(c.Peers, func(p Peer) bool { return p.ID == c.NodeID }) {
		return fmt.Errorf("peers do not list this node's id %q", c.NodeID)
	}
	return nil
}

// Node is a Raft member. It is safe for simultaneous use.
type Node struct {
	cfg   Config
	log   *slog.Logger
	raft  *raft.Raft
	fsm   *FSM
	layer *streamLayer          // nil in memory
	trans raft.Transport        // *raft.NetworkTransport, or in memory *raft.InmemTransport
	bolt  *raftboltdb.BoltStore // nil in memory
	logs  raft.LogStore         // bolt, or in memory a *raft.InmemStore
	snaps raft.SnapshotStore
	// raftUp is set once raft exists: the stream layer answers probes
	// before that, and they must not touch it.
	raftUp atomic.Bool
	state  atomic.Bool // has Raft state (bootstrapped or joined)
	// caughtUp latches once the node has applied every entry up to the
	// commit index it learned after start; see readiness.go.
	caughtUp atomic.Bool
	target   atomic.Uint64 // commit index to reach before caught up
	// through is the highest index known to be applied by the FSM, every
	// entry type counted (see appliedThrough).
	through atomic.Uint64
	// termCommitted is the term in which this node, leading, has seen an
	// entry of its own term committed (reads are current from then on).
	termCommitted atomic.Uint64
	draining      atomic.Bool
	// removed latches once the Raft configuration no longer lists this
	// node (removed.go).
	removed atomic.Bool
	// member is what checkRemoved has seen of this node in the Raft
	// configuration (removed.go).
	member atomic.Uint32
	// ledUntil is when this node last learned of a leader or stopped
	// leading (unix nanoseconds), for readiness: raft's LastContact
	// counts only messages from another leader.
	ledUntil atomic.Int64
	started  time.Time

	hbMu      sync.Mutex
	hbFailing map[string]time.Time // peers whose heartbeats fail, since when

	// health is the leader's record of each member's health, for the
	// routing view and autopilot (see liveness.go).
	health healthBook
	kick   chan struct{} // wakes the liveness loop; see kickLiveness
	// caughtUpCh is closed when caughtUp latches.
	caughtUpCh chan struct{}

	done      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	leaderSig atomic.Pointer[chan struct{}]
}

var _ rule.Store = (*Node)(nil)

// Open opens the stores under DataDir, starts Raft and bootstraps when the
// configuration says so. Joining and --bootstrap-expect go on in the
// background.
func Open(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("raft config: %w", err)
	}
	if cfg.InMemory {
		return openInmem(cfg)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	n := &Node{cfg: cfg, log: log, fsm: NewFSM(), hbFailing: map[string]time.Time{}, done: make(chan struct{}), started: time.Now(), kick: make(chan struct{}, 1), caughtUpCh: make(chan struct{})}
	ch := make(chan struct{})
	n.leaderSig.Store(&ch)
	ok := false
	defer func() {
		if !ok {
			n.closeStores()
		}
	}()
	// Damaged stores stop the node here, with an error that says what to
	// do, rather than as a panic inside raft or a silently missing rule.
	if err := CheckDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	var err error
	if n.bolt, err = openBolt(cfg.DataDir, false); err != nil {
		return nil, err
	}
	n.logs = n.bolt
	hl := newHCLogger(log, "raft")
	if n.snaps, err = raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 3, hl); err != nil {
		return nil, fmt.Errorf("open snapshots: %w", err)
	}
	has, err := raft.HasExistingState(n.bolt, n.bolt, n.snaps)
	if err != nil {
		return nil, fmt.Errorf("read raft state: %w", err)
	}
	n.state.Store(has)
	if removalRecorded(n.bolt, cfg.NodeID) {
		n.log.Error(removedMessage, "node", cfg.NodeID, "data_dir", cfg.DataDir)
		return nil, fmt.Errorf("start from %s: %w", cfg.DataDir, ErrRemoved)
	}
	if n.layer, err = newStreamLayerWith(streamOptions{Bind: cfg.RaftBind, Listener: cfg.RaftListener, Logger: log, Advertise: cfg.AdvertiseRaft, Probe: n.probeInfo, Dial: cfg.Dial,
		ServerTLS: cfg.PeerServerTLS, ClientTLS: cfg.PeerClientTLS}); err != nil {
		return nil, err
	}
	n.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: n.layer, MaxPool: 3, Timeout: 10 * time.Second, Logger: hl,
	})
	if n.raft, err = newRaft(cfg.raftConfig(hl), n.fsm, n.bolt, n.bolt, n.snaps, n.trans); err != nil {
		return nil, fmt.Errorf("start raft from %s: %w", cfg.DataDir, err)
	}
	n.raftUp.Store(true)
	if has && n.removedAtStart() {
		n.log.Error(removedMessage, "node", cfg.NodeID, "data_dir", cfg.DataDir)
		n.recordRemoved()
		_ = n.raft.Shutdown().Error()
		return nil, fmt.Errorf("start from %s: %w", cfg.DataDir, ErrRemoved)
	}
	ok = true
	n.observe()
	switch {
	case has:
		n.log.Info("raft state found: rejoining the cluster", "node", cfg.NodeID, "data_dir", cfg.DataDir)
	case cfg.BootstrapExpect > 0:
		n.wg.Add(1)
		go n.bootstrapExpect()
	case cfg.Join:
	default:
		if err := n.bootstrap([]Peer{{ID: cfg.NodeID, RaftAddr: n.RaftAddr()}}); err != nil {
			n.Close()
			return nil, err
		}
	}
	n.wg.Add(3)
	go n.register()
	go n.liveness()
	go n.readiness()
	return n, nil
}

// raftConfig is hashicorp/raft's configuration for c.
func (c *Config) raftConfig(hl hclog.Logger) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(c.NodeID)
	rc.HeartbeatTimeout = c.HeartbeatTimeout
	rc.ElectionTimeout = c.ElectionTimeout
	rc.LeaderLeaseTimeout = c.LeaderLeaseTimeout
	rc.CommitTimeout = c.CommitTimeout
	rc.SnapshotThreshold = c.SnapshotThreshold
	rc.SnapshotInterval = c.SnapshotInterval
	rc.Logger = hl
	// A leader that removes itself stays up as an idle follower (and
	// reports Removed) rather than shutting raft down under the node.
	rc.ShutdownOnRemove = false
	return rc
}

// newRaft starts raft, turning a panic while it reads its stores into an
// error (CheckDataDir runs first, so this is a last line of defence).
func newRaft(rc *raft.Config, fsm raft.FSM, logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore, trans raft.Transport) (r *raft.Raft, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("reading the stores failed: %v: %w", p, ErrDamaged)
		}
	}()
	return raft.NewRaft(rc, fsm, logs, stable, snaps, trans)
}

// RaftAddr is the advertised Raft address.
func (n *Node) RaftAddr() string {
	if n.layer == nil {
		return string(n.trans.LocalAddr())
	}
	return n.layer.Addr().String()
}

// probePeer asks the node at a Raft address who it is. In memory the only
// node there is is this one.
func (n *Node) probePeer(address string, timeout time.Duration) (probeInfo, error) {
	if n.layer == nil {
		if address != n.RaftAddr() {
			return probeInfo{}, fmt.Errorf("probe %s: an in-memory node reaches no other node", address)
		}
		return n.probeInfo(), nil
	}
	return probe(n.layer.dial, address, timeout)
}

// self is this node as a member.
func (n *Node) self() cluster.Member {
	return cluster.Member{ID: n.cfg.NodeID, GRPCAddr: n.cfg.AdvertiseGRPC, RaftAddr: n.RaftAddr()}
}

// ID is the node id.
func (n *Node) ID() string { return n.cfg.NodeID }

// leaderChanged is closed at the next leader change.
func (n *Node) leaderChanged() <-chan struct{} { return *n.leaderSig.Load() }

// leader returns the leader's id and gRPC address ("" when unknown).
func (n *Node) leader() (id, grpcAddr string) {
	_, lid := n.raft.LeaderWithID()
	if lid == "" {
		return "", ""
	}
	if string(lid) == n.cfg.NodeID {
		return n.cfg.NodeID, n.cfg.AdvertiseGRPC
	}
	return string(lid), n.fsm.members()[string(lid)].GRPCAddr
}

// Leader returns the leader's id and gRPC address ("" when unknown).
func (n *Node) Leader() (id, grpcAddr string) { return n.leader() }

// IsLeader reports whether this node leads.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Table implements rule.Store: the local copy.
func (n *Node) Table() *rule.Table { return n.fsm.Table() }

// View is the routing view as applied locally.
func (n *Node) View() *cluster.View { return n.fsm.View() }

// ViewChanged is closed when the view next changes.
func (n *Node) ViewChanged() <-chan struct{} { return n.fsm.ViewChanged() }

// awaitLeader waits until a leader is known and returns nil if it is this
// node, a *rule.LeaderError naming it otherwise, or ErrNoLeader when ctx
// ends first.
func (n *Node) awaitLeader(ctx context.Context) error {
	for {
		if n.IsLeader() {
			return nil
		}
		if id, addr := n.leader(); id != "" && addr != "" {
			return &rule.LeaderError{ID: id, GRPCAddr: addr}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no leader known within the deadline: %w", rule.ErrNoLeader)
		case <-n.done:
			return fmt.Errorf("node is shutting down: %w", rule.ErrNoLeader)
		case <-n.leaderChanged():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// apply proposes an entry on the leader and returns the FSM's answer.
func (n *Node) apply(ctx context.Context, entry []byte) (applyResult, error) {
	if err := n.awaitLeader(ctx); err != nil {
		return applyResult{}, err
	}
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	start := time.Now()
	f := n.raft.Apply(entry, timeout)
	err := f.Error()
	if n.cfg.ObserveApply != nil {
		n.cfg.ObserveApply(time.Since(start))
	}
	if err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrLeadershipTransferInProgress) || errors.Is(err, raft.ErrEnqueueTimeout) {
			return applyResult{}, fmt.Errorf("apply: %w: %w", err, rule.ErrNoLeader)
		}
		return applyResult{}, fmt.Errorf("apply: %w", err)
	}
	res, _ := f.Response().(applyResult)
	return res, nil
}

// Raft exposes the raft instance for metrics and snapshots.
func (n *Node) Raft() *raft.Raft { return n.raft }

// Close leaves cleanly: a leader first hands leadership to another voter,
// then Raft shuts down and the stores close. A Raft shutdown still blocked
// after shutdownUnblockAfter (a write to a peer that no longer reads) has
// its connections closed under it, so that it ends.
func (n *Node) Close() error {
	var err error
	n.closeOnce.Do(func() {
		if n.IsLeader() && n.voters() > 1 {
			if terr := n.raft.LeadershipTransfer().Error(); terr != nil {
				n.log.Warn("leadership transfer failed", "err", terr)
			} else {
				n.log.Info("leadership transferred")
			}
		}
		close(n.done)
		if n.layer != nil {
			n.layer.endDials()
		}
		shut := n.raft.Shutdown()
		if n.layer != nil {
			// raft's shutdown waits for its replication goroutines: one
			// blocked in a write to a peer that no longer reads ends only
			// when its connection does.
			ended := make(chan struct{})
			go func() { _ = shut.Error(); close(ended) }()
			select {
			case <-ended:
			case <-time.After(shutdownUnblockAfter):
				n.log.Warn("raft shutdown blocked on a peer connection: closing the Raft connections")
				n.layer.abortConns()
			}
		}
		if serr := shut.Error(); serr != nil {
			err = fmt.Errorf("raft shutdown: %w", serr)
		}
		n.wg.Wait()
		n.closeStores()
	})
	return err
}

// shutdownUnblockAfter is how long Close lets raft shut down before it
// closes the Raft connections under it.
const shutdownUnblockAfter = 500 * time.Millisecond

func (n *Node) closeStores() {
	if c, ok := n.trans.(io.Closer); ok && c != nil {
		c.Close()
	}
	if n.layer != nil {
		n.layer.Close()
		n.layer.wg.Wait()
	}
	if n.bolt != nil {
		n.bolt.Close()
	}
}

// observe follows leader changes and peer heartbeat failures.
func (n *Node) observe() {
	ch := make(chan raft.Observation, 64)
	n.raft.RegisterObserver(raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation:
			return true
		}
		return false
	}))
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		var prev raft.ServerID
		for {
			select {
			case <-n.done:
				return
			case o := <-ch:
				switch d := o.Data.(type) {
				case raft.LeaderObservation:
					n.log.Info("leader changed", "leader", string(d.LeaderID))
					if d.LeaderID != "" || string(prev) == n.cfg.NodeID {
						n.ledUntil.Store(time.Now().UnixNano())
					}
					prev = d.LeaderID
					next := make(chan struct{})
					close(*n.leaderSig.Swap(&next))
					n.kickLiveness() // a new leader commits its first view at once
				case raft.FailedHeartbeatObservation:
					n.hbMu.Lock()
					if _, ok := n.hbFailing[string(d.PeerID)]; !ok {
						n.hbFailing[string(d.PeerID)] = d.LastContact
					}
					n.hbMu.Unlock()
				case raft.ResumedHeartbeatObservation:
					n.hbMu.Lock()
					delete(n.hbFailing, string(d.PeerID))
					n.hbMu.Unlock()
				}
			}
		}
	}()
}

func (n *Node) voters() int {
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return 0
	}
	v := 0
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			v++
		}
	}
	return v
}
