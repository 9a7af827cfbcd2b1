// Package raftfsm replicates tokenserver's rules and routing view with
// hashicorp/raft: the FSM, the raft-boltdb log and stable stores, file
// snapshots, bootstrapping, membership and liveness; it implements
// rule.Store.
package raftfsm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

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
	// CommitTimeout are Raft's timeouts.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// SnapshotThreshold is the number of log entries between snapshots.
	SnapshotThreshold uint64
	// SnapshotInterval is how often Raft checks whether to snapshot.
	SnapshotInterval time.Duration
	// MaxVoters is the most voting members; more join as non-voters.
	MaxVoters int
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
	// Logger receives the node's and Raft's logs.
	Logger *slog.Logger
	// ObserveApply, when set, receives the time each entry this node
	// proposed took to commit and apply.
	ObserveApply func(time.Duration)
	// Dial, when set, replaces plain TCP for reaching other nodes' Raft
	// addresses (tests route it through fault-injecting proxies).
	Dial func(address string, timeout time.Duration) (net.Conn, error)
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
		DownAfter:          5 * time.Second,
		UpAfter:            10 * time.Second,
		LivenessInterval:   500 * time.Millisecond,
	}
}

// FastTimeouts sets the test timeouts: heartbeat and election 300 ms,
// leader lease 150 ms.
func (c *Config) FastTimeouts() {
	c.HeartbeatTimeout = 300 * time.Millisecond
	c.ElectionTimeout = 300 * time.Millisecond
	c.LeaderLeaseTimeout = 150 * time.Millisecond
	c.CommitTimeout = 20 * time.Millisecond
}

// Validate reports the first problem with c, naming the field.
func (c *Config) Validate() error {
	switch {
	case c.NodeID == "":
		return errors.New("node id is empty")
	case c.DataDir == "":
		return errors.New("data dir is empty")
	case c.RaftBind == "":
		return errors.New("raft address is empty")
	case c.AdvertiseGRPC == "":
		return errors.New("advertised grpc address is empty")
	case c.BootstrapExpect < 0:
		return fmt.Errorf("bootstrap-expect must be >= 0, got %d", c.BootstrapExpect)
	case c.BootstrapExpect > 0 && c.Join:
		return errors.New("bootstrap-expect and join exclude each other")
	case c.BootstrapExpect > 0 && len(c.Peers) != c.BootstrapExpect:
		return fmt.Errorf("bootstrap-expect is %d but %d peers are listed", c.BootstrapExpect, len(c.Peers))
	case c.MaxVoters < 1:
		return fmt.Errorf("max voters must be >= 1, got %d", c.MaxVoters)
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
	cfg    Config
	log    *slog.Logger
	raft   *raft.Raft
	fsm    *FSM
	layer  *streamLayer
	trans  *raft.NetworkTransport
	bolt   *raftboltdb.BoltStore
	snaps  *raft.FileSnapshotStore
	state  atomic.Bool // has Raft state (bootstrapped or joined)
	ready  atomic.Bool
	target atomic.Uint64 // commit index to reach before ready
	// barrierTerm is the term in which a read Barrier last succeeded.
	barrierTerm atomic.Uint64

	hbMu      sync.Mutex
	hbFailing map[string]time.Time // peers whose heartbeats fail, since when

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
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	n := &Node{cfg: cfg, log: log, fsm: NewFSM(), hbFailing: map[string]time.Time{}, done: make(chan struct{})}
	ch := make(chan struct{})
	n.leaderSig.Store(&ch)
	ok := false
	defer func() {
		if !ok {
			n.closeStores()
		}
	}()
	var err error
	if n.bolt, err = raftboltdb.NewBoltStore(filepath.Join(cfg.DataDir, "raft.db")); err != nil {
		return nil, fmt.Errorf("open raft log: %w", err)
	}
	hl := newHCLogger(log, "raft")
	if n.snaps, err = raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 3, hl); err != nil {
		return nil, fmt.Errorf("open snapshots: %w", err)
	}
	has, err := raft.HasExistingState(n.bolt, n.bolt, n.snaps)
	if err != nil {
		return nil, fmt.Errorf("read raft state: %w", err)
	}
	n.state.Store(has)
	if n.layer, err = newStreamLayer(cfg.RaftBind, cfg.AdvertiseRaft, n.probeInfo, cfg.Dial); err != nil {
		return nil, err
	}
	n.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: n.layer, MaxPool: 3, Timeout: 10 * time.Second, Logger: hl,
	})
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.Logger = hl
	if n.raft, err = raft.NewRaft(rc, n.fsm, n.bolt, n.bolt, n.snaps, n.trans); err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
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

// RaftAddr is the advertised Raft address.
func (n *Node) RaftAddr() string { return n.layer.Addr().String() }

// self is this node as a member.
func (n *Node) self() cluster.Member {
	return cluster.Member{ID: n.cfg.NodeID, GRPCAddr: n.cfg.AdvertiseGRPC, RaftAddr: n.RaftAddr()}
}

// ID is the node id.
func (n *Node) ID() string { return n.cfg.NodeID }

func (n *Node) bootstrap(peers []Peer) error {
	var conf raft.Configuration
	sorted := append([]Peer(nil), peers...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].ID < sorted[j].ID })
	for _, p := range sorted {
		conf.Servers = append(conf.Servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr), Suffrage: raft.Voter})
	}
	if err := n.raft.BootstrapCluster(conf).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		return fmt.Errorf("bootstrap: %w", err)
	}
	n.state.Store(true)
	n.log.Info("bootstrapped a new cluster", "node", n.cfg.NodeID, "servers", len(conf.Servers))
	return nil
}

func (n *Node) probeInfo() probeInfo {
	id, _ := n.leader()
	return probeInfo{ID: n.cfg.NodeID, GRPCAddr: n.cfg.AdvertiseGRPC, HasState: n.state.Load() || n.raft.LastIndex() > 0, Leader: id}
}

// bootstrapExpect waits until every peer answers; if none has state it
// bootstraps with the sorted peer list (every peer does the same), and if
// one has, it joins that cluster instead.
func (n *Node) bootstrapExpect() {
	defer n.wg.Done()
	for attempt := 0; ; attempt++ {
		if n.state.Load() || n.raft.LastIndex() > 0 {
			n.state.Store(true)
			return
		}
		reached, withState := 0, []string{}
		for _, p := range n.cfg.Peers {
			if p.ID == n.cfg.NodeID {
				reached++
				continue
			}
			info, err := probe(n.layer.dial, p.RaftAddr, 2*time.Second)
			if err != nil {
				if attempt%10 == 0 {
					n.log.Info("waiting for bootstrap peer", "peer", p.ID, "raft_addr", p.RaftAddr, "err", err)
				}
				continue
			}
			reached++
			if info.HasState {
				withState = append(withState, info.GRPCAddr)
			}
		}
		switch {
		case len(withState) > 0:
			n.log.Info("found an existing cluster: joining it", "via", withState)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := n.cfg.JoinVia(ctx, withState, n.self())
			cancel()
			if err == nil {
				n.state.Store(true)
				return
			}
			n.log.Warn("join failed; retrying", "err", err)
		case reached == n.cfg.BootstrapExpect:
			if err := n.bootstrap(n.cfg.Peers); err != nil {
				n.log.Error("bootstrap failed; retrying", "err", err)
			} else {
				return
			}
		}
		select {
		case <-n.done:
			return
		case <-time.After(time.Second):
		}
	}
}

// JoinCluster asks the members at addrs (gRPC) to add this node, retrying
// until it is in or ctx ends. A node with Raft state does nothing.
func (n *Node) JoinCluster(ctx context.Context, addrs []string) error {
	if n.state.Load() {
		return nil
	}
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		err := n.cfg.JoinVia(ctx, addrs, n.self())
		if err == nil {
			n.state.Store(true)
			n.log.Info("joined the cluster", "via", addrs)
			return nil
		}
		n.log.Warn("join failed; retrying", "via", addrs, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("join %v: %w", addrs, err)
		case <-n.done:
			return errors.New("join: node closed")
		case <-time.After(backoff):
		}
	}
}

// register makes sure the FSM has this node's addresses, so that the
// others can route to it: directly when leading, else through the leader.
func (n *Node) register() {
	defer n.wg.Done()
	for {
		if m, ok := n.fsm.members()[n.cfg.NodeID]; ok && m.GRPCAddr == n.cfg.AdvertiseGRPC && m.RaftAddr == n.RaftAddr() {
			return
		}
		if n.state.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var err error
			if n.IsLeader() {
				err = n.AddMember(ctx, n.cfg.NodeID, n.RaftAddr(), n.cfg.AdvertiseGRPC)
			} else if _, addr := n.leader(); addr != "" {
				err = n.cfg.JoinVia(ctx, []string{addr}, n.self())
			}
			cancel()
			if err != nil {
				n.log.Debug("register addresses: retrying", "err", err)
			}
		}
		select {
		case <-n.done:
			return
		case <-n.leaderChanged():
		case <-n.fsm.ViewChanged():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// readiness latches ready once the node has applied up to the first commit
// index it saw and has a routing view.
func (n *Node) readiness() {
	defer n.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if target := n.target.Load(); target == 0 {
			if ci := n.raft.CommitIndex(); ci > 0 {
				n.target.Store(ci)
			}
		} else if n.fsm.AppliedIndex() >= target && n.fsm.View().Len() > 0 {
			n.ready.Store(true)
			n.log.Info("ready", "applied_index", n.fsm.AppliedIndex(), "epoch", n.fsm.View().Epoch)
			return
		}
		select {
		case <-n.done:
			return
		case <-t.C:
		}
	}
}

// Ready reports whether the node has caught up with the log it saw at start
// and has a routing view. Once ready it stays ready (an election does not
// make a node unready).
func (n *Node) Ready() bool { return n.ready.Load() }

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
		for {
			select {
			case <-n.done:
				return
			case o := <-ch:
				switch d := o.Data.(type) {
				case raft.LeaderObservation:
					n.log.Info("leader changed", "leader", string(d.LeaderID))
					next := make(chan struct{})
					close(*n.leaderSig.Swap(&next))
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
			return applyResult{}, fmt.Errorf("apply: %v: %w", err, rule.ErrNoLeader)
		}
		return applyResult{}, fmt.Errorf("apply: %w", err)
	}
	res, _ := f.Response().(applyResult)
	return res, nil
}

// Put implements rule.Store on the leader; elsewhere it returns a
// *rule.LeaderError for the caller to forward.
func (n *Node) Put(ctx context.Context, r *rule.Rule, expected *uint64) (*rule.Rule, error) {
	r = r.Clone()
	r.Normalize()
	if err := r.Validate(); err != nil {
		return nil, err
	}
	entry, err := encode(entryPutRule, putRuleEntry{Rule: r, Expected: expected})
	if err != nil {
		return nil, err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return nil, err
	}
	return res.rule, res.err
}

// Delete implements rule.Store, like Put.
func (n *Node) Delete(ctx context.Context, name string, expected *uint64) error {
	if err := rule.ValidName(name); err != nil {
		return err
	}
	entry, err := encode(entryDeleteRule, deleteRuleEntry{Name: name, Expected: expected})
	if err != nil {
		return err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return err
	}
	return res.err
}

// consistent makes sure a read on this node sees every acknowledged write:
// it must lead and have applied everything committed before the read. A
// new leader's commit index can lag entries the old leader committed until
// an entry of its own term commits, so the first read of each term is a
// Barrier (an entry of this term, committed by a majority); later reads of
// the term confirm leadership with VerifyLeader.
func (n *Node) consistent(ctx context.Context) error {
	if err := n.awaitLeader(ctx); err != nil {
		return err
	}
	term := n.term()
	if n.barrierTerm.Load() != term || n.fsm.AppliedIndex() < n.raft.CommitIndex() {
		if err := n.raft.Barrier(5 * time.Second).Error(); err != nil {
			return fmt.Errorf("barrier: %v: %w", err, rule.ErrNoLeader)
		}
		n.barrierTerm.Store(term)
		return nil
	}
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return fmt.Errorf("verify leader: %v: %w", err, rule.ErrNoLeader)
	}
	return nil
}

// Get implements rule.Store: a current read on the leader.
func (n *Node) Get(ctx context.Context, name string) (*rule.Rule, error) {
	if err := rule.ValidName(name); err != nil {
		return nil, err
	}
	if err := n.consistent(ctx); err != nil {
		return nil, err
	}
	c := n.fsm.Table().Get(name)
	if c == nil {
		return nil, fmt.Errorf("get %q: %w", name, rule.ErrNotFound)
	}
	return c.Rule.Clone(), nil
}

// List implements rule.Store: a current read on the leader.
func (n *Node) List(ctx context.Context) ([]*rule.Rule, error) {
	if err := n.consistent(ctx); err != nil {
		return nil, err
	}
	rules := n.fsm.Table().Rules()
	for i, r := range rules {
		rules[i] = r.Clone()
	}
	return rules, nil
}

// SnapshotSave takes a Raft snapshot on the leader and opens it: JSON of the
// FSM state (rules, members, view). The caller closes the reader.
func (n *Node) SnapshotSave(ctx context.Context) (io.ReadCloser, error) {
	if err := n.consistent(ctx); err != nil {
		return nil, err
	}
	f := n.raft.Snapshot()
	if err := f.Error(); err != nil {
		if !errors.Is(err, raft.ErrNothingNewToSnapshot) {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		// The latest snapshot already holds the current state.
		metas, lerr := n.snaps.List()
		if lerr != nil || len(metas) == 0 {
			return nil, fmt.Errorf("snapshot: nothing new, and no snapshot to open: %v", lerr)
		}
		_, rc, oerr := n.snaps.Open(metas[0].ID)
		if oerr != nil {
			return nil, fmt.Errorf("open snapshot %s: %w", metas[0].ID, oerr)
		}
		return rc, nil
	}
	_, rc, err := f.Open()
	if err != nil {
		return nil, fmt.Errorf("open snapshot: %w", err)
	}
	return rc, nil
}

// RestoreRules replaces the rule table with the rules of a snapshot made by
// SnapshotSave, as one log entry; membership is kept. It returns the
// number of rules and the version of the restore.
func (n *Node) RestoreRules(ctx context.Context, snapshot io.Reader) (int, uint64, error) {
	var st fsmState
	if err := json.NewDecoder(snapshot).Decode(&st); err != nil {
		return 0, 0, rule.Invalid("not a tokenserver snapshot: %v", err)
	}
	var e restoreEntry
	for name, r := range st.Rules {
		if r == nil || r.Name != name {
			return 0, 0, rule.Invalid("snapshot: malformed rule %q", name)
		}
		if err := r.Validate(); err != nil {
			return 0, 0, fmt.Errorf("snapshot: %w", err)
		}
		e.Rules = append(e.Rules, r)
	}
	sort.Slice(e.Rules, func(i, j int) bool { return e.Rules[i].Name < e.Rules[j].Name })
	entry, err := encode(entryRestoreRules, e)
	if err != nil {
		return 0, 0, err
	}
	if err := n.awaitLeader(ctx); err != nil {
		return 0, 0, err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return 0, 0, err
	}
	if res.err != nil {
		return 0, 0, res.err
	}
	t := n.fsm.Table()
	return t.Len(), t.Version, nil
}

// AddMember adds a node (on the leader): as a voter while there are fewer
// than MaxVoters, else as a non-voter; and records its addresses. Adding a
// member that is already in with the same address only updates them.
func (n *Node) AddMember(ctx context.Context, id, raftAddr, grpcAddr string) error {
	if id == "" || raftAddr == "" || grpcAddr == "" {
		return rule.Invalid("join needs an id, a raft address and a grpc address")
	}
	if err := n.awaitLeader(ctx); err != nil {
		return err
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return fmt.Errorf("read configuration: %w", err)
	}
	voters, present := 0, false
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters++
		}
		if string(s.ID) == id {
			present = string(s.Address) == raftAddr
			if !present {
				if err := n.raft.RemoveServer(s.ID, 0, 10*time.Second).Error(); err != nil {
					return fmt.Errorf("replace %s: %w", id, err)
				}
				if s.Suffrage == raft.Voter {
					voters--
				}
			}
		}
	}
	if !present {
		var f raft.IndexFuture
		if voters < n.cfg.MaxVoters {
			f = n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, 10*time.Second)
		} else {
			f = n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, 10*time.Second)
		}
		if err := f.Error(); err != nil {
			return fmt.Errorf("add %s: %w", id, err)
		}
		n.log.Info("member added", "member", id, "raft_addr", raftAddr, "grpc_addr", grpcAddr, "voter", voters < n.cfg.MaxVoters)
	}
	entry, err := encode(entrySetMember, memberEntry{Member: memberInfo{ID: id, GRPCAddr: grpcAddr, RaftAddr: raftAddr}})
	if err != nil {
		return err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return err
	}
	return res.err
}

// RemoveMember takes a node out of the cluster (on the leader).
func (n *Node) RemoveMember(ctx context.Context, id string) error {
	if err := n.awaitLeader(ctx); err != nil {
		return err
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return fmt.Errorf("read configuration: %w", err)
	}
	found := false
	for _, s := range cf.Configuration().Servers {
		found = found || string(s.ID) == id
	}
	if _, ok := n.fsm.members()[id]; !found && !ok {
		return fmt.Errorf("member %q: %w", id, rule.ErrNotFound)
	}
	if found {
		if err := n.raft.RemoveServer(raft.ServerID(id), 0, 10*time.Second).Error(); err != nil {
			return fmt.Errorf("remove %s: %w", id, err)
		}
	}
	entry, err := encode(entryRemoveMember, memberEntry{Member: memberInfo{ID: id}})
	if err != nil {
		return err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return err
	}
	n.log.Info("member removed", "member", id)
	return res.err
}

// MemberStatus is one member as the local node sees it.
type MemberStatus struct {
	ID       string
	RaftAddr string
	GRPCAddr string
	Voter    bool
	Leader   bool
	Live     bool
}

// Status is the local node's view of the cluster.
type Status struct {
	ID           string
	State        string
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	LastIndex    uint64
	LastContact  time.Time
	Leader       string
	Epoch        uint64
	Members      []MemberStatus
}

// Status returns the local node's view of the cluster.
func (n *Node) Status() (Status, error) {
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return Status{}, fmt.Errorf("read configuration: %w", err)
	}
	leaderID, _ := n.leader()
	st := Status{
		ID:           n.cfg.NodeID,
		State:        n.raft.State().String(),
		Term:         n.term(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.fsm.AppliedIndex(),
		LastIndex:    n.raft.LastIndex(),
		LastContact:  n.raft.LastContact(),
		Leader:       leaderID,
		Epoch:        n.fsm.View().Epoch,
	}
	members, live := n.fsm.members(), n.fsm.live()
	for _, s := range cf.Configuration().Servers {
		id := string(s.ID)
		st.Members = append(st.Members, MemberStatus{
			ID: id, RaftAddr: string(s.Address), GRPCAddr: members[id].GRPCAddr,
			Voter: s.Suffrage == raft.Voter, Leader: id == leaderID, Live: slices.Contains(live, id),
		})
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].ID < st.Members[j].ID })
	return st, nil
}

func (n *Node) term() uint64 {
	var t uint64
	fmt.Sscan(n.raft.Stats()["term"], &t)
	return t
}

// Raft exposes the raft instance for metrics and snapshots.
func (n *Node) Raft() *raft.Raft { return n.raft }

// liveness runs on every node and acts while it leads: it health-checks the
// members and commits a new routing view when one goes down for DownAfter,
// comes back healthy for UpAfter, or is new and healthy.
func (n *Node) liveness() {
	defer n.wg.Done()
	type track struct {
		ok    bool
		since time.Time
	}
	tracks := map[string]*track{}
	t := time.NewTicker(n.cfg.LivenessInterval)
	defer t.Stop()
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
		}
		if !n.IsLeader() {
			clear(tracks)
			continue
		}
		cf := n.raft.GetConfiguration()
		if cf.Error() != nil {
			continue
		}
		members, live := n.fsm.members(), n.fsm.live()
		now := time.Now()
		var want []string
		for _, s := range cf.Configuration().Servers {
			id := string(s.ID)
			m, known := members[id]
			ok := known && m.GRPCAddr != ""
			if ok && id != n.cfg.NodeID {
				n.hbMu.Lock()
				since, failing := n.hbFailing[id]
				n.hbMu.Unlock()
				ok = !(failing && now.Sub(since) > n.cfg.DownAfter)
				if ok {
					ctx, cancel := context.WithTimeout(context.Background(), min(time.Second, n.cfg.DownAfter/2))
					ok = n.cfg.Health(ctx, m.GRPCAddr)
					cancel()
				}
			}
			tr := tracks[id]
			if tr == nil || tr.ok != ok {
				tr = &track{ok: ok, since: now}
				tracks[id] = tr
			}
			inView := slices.Contains(live, id)
			switch {
			case inView && (ok || now.Sub(tr.since) < n.cfg.DownAfter):
				want = append(want, id)
			case !inView && ok && (!m.WasLive || now.Sub(tr.since) >= n.cfg.UpAfter):
				want = append(want, id)
			}
		}
		sort.Strings(want)
		if !slices.Equal(want, live) {
			entry, err := encode(entrySetView, viewEntry{Live: want})
			if err != nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if _, err := n.apply(ctx, entry); err != nil {
				n.log.Warn("routing view change failed", "err", err)
			} else {
				n.log.Info("routing view changed", "live", want, "was", live)
			}
			cancel()
		}
	}
}

// Close leaves cleanly: a leader first hands leadership to another voter,
// then Raft shuts down and the stores close.
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
		if serr := n.raft.Shutdown().Error(); serr != nil {
			err = fmt.Errorf("raft shutdown: %w", serr)
		}
		n.wg.Wait()
		n.closeStores()
	})
	return err
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

func (n *Node) closeStores() {
	if n.trans != nil {
		n.trans.Close()
	}
	if n.layer != nil {
		n.layer.Close()
		n.layer.wg.Wait()
	}
	if n.bolt != nil {
		n.bolt.Close()
	}
}
