package raftfsm

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// Liveness: the leader health-checks the members, commits a new routing
// view when one goes down for DownAfter, comes back healthy for UpAfter,
// or is new (or drained and back) and healthy, and applies autopilot's
// plan (autopilot.go).

// memberHealth is the leader's record of one member's health.
type memberHealth struct {
	OK    bool
	Since time.Time
}

// healthBook is the leader's health record of every member. It is reset
// when the node stops leading: a new leader judges afresh.
type healthBook struct {
	mu sync.Mutex
	m  map[string]memberHealth
}

// set records ok for id at now and returns the record (Since moves only
// when the health changes).
func (h *healthBook) set(id string, ok bool, now time.Time) memberHealth {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string]memberHealth{}
	}
	r, seen := h.m[id]
	if !seen || r.OK != ok {
		r = memberHealth{OK: ok, Since: now}
		h.m[id] = r
	}
	return r
}

// get returns id's record.
func (h *healthBook) get(id string) (memberHealth, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.m[id]
	return r, ok
}

func (h *healthBook) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.m)
}

// kickLiveness makes the leader's liveness loop look at the members now
// rather than at its next tick (a member registered again, say).
func (n *Node) kickLiveness() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// policy is the autopilot policy of the node's configuration.
func (n *Node) policy() apPolicy {
	return apPolicy{MaxVoters: n.cfg.MaxVoters, Stabilization: n.cfg.StabilizationTime,
		DeadAfter: n.cfg.DeadMemberAfter, CleanupDeadVoters: n.cfg.CleanupDeadVoters}
}

// checkHealth reports whether member id (at grpcAddr) is healthy now: for
// this node, caught up and not draining; for another, answering its member
// health check (which says caught up and not draining) and, while it is in
// the view, without failing Raft heartbeats for DownAfter. A member out of
// the view is judged by its health check alone: raft's own reconnection
// backs off for seconds, and the view must not wait for it.
func (n *Node) checkHealth(id, grpcAddr string, inView bool, now time.Time) bool {
	if id == n.cfg.NodeID {
		return n.CaughtUp() && !n.draining.Load()
	}
	if grpcAddr == "" {
		return false
	}
	if inView {
		n.hbMu.Lock()
		since, failing := n.hbFailing[id]
		n.hbMu.Unlock()
		if failing && now.Sub(since) > n.cfg.DownAfter {
			return false
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(time.Second, n.cfg.DownAfter/2))
	defer cancel()
	return n.cfg.Health(ctx, grpcAddr)
}

func (n *Node) liveness() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.LivenessInterval)
	defer t.Stop()
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
		case <-n.kick:
		}
		n.checkRemoved()
		if !n.IsLeader() {
			n.health.reset()
			continue
		}
		cf := n.raft.GetConfiguration()
		if cf.Error() != nil {
			continue
		}
		servers := cf.Configuration().Servers
		members, live := n.fsm.members(), n.fsm.live()
		now := time.Now()
		// Check every member at once: one after another, a frozen member's
		// timeout delayed the checks (and the view) of all the others.
		healthy := make([]bool, len(servers))
		var wg sync.WaitGroup
		for i, s := range servers {
			id := string(s.ID)
			m, known := members[id]
			if !known || m.Draining {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				healthy[i] = n.checkHealth(id, m.GRPCAddr, slices.Contains(live, id), now)
			}()
		}
		wg.Wait()
		var want []string
		var ap []apMember
		for i, s := range servers {
			id := string(s.ID)
			m := members[id]
			inView := slices.Contains(live, id)
			ok := healthy[i]
			h := n.health.set(id, ok, now)
			switch {
			case inView && (ok || now.Sub(h.Since) < n.cfg.DownAfter):
				want = append(want, id)
			case !inView && ok && (!m.WasLive || now.Sub(h.Since) >= n.cfg.UpAfter):
				want = append(want, id)
			}
			ap = append(ap, apMember{ID: id, Voter: s.Suffrage == raft.Voter, Healthy: ok, For: now.Sub(h.Since), Self: id == n.cfg.NodeID})
		}
		sort.Strings(want)
		if !slices.Equal(want, live) {
			n.commitView(want, live)
		}
		n.autopilot(ap, servers)
	}
}

// commitView commits a new routing view.
func (n *Node) commitView(want, was []string) {
	entry, err := encodeEntry(entrySetView, &raftv1.SetView{Live: want})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := n.apply(ctx, entry); err != nil {
		n.log.Warn("routing view change failed", "err", err)
		return
	}
	n.log.Info("routing view changed", "live", want, "was", was)
}

// autopilot applies the policy's plan: promotions and dead-member removals.
func (n *Node) autopilot(ms []apMember, servers []raft.Server) {
	plan := n.policy().plan(ms)
	addr := map[string]raft.ServerAddress{}
	for _, s := range servers {
		addr[string(s.ID)] = s.Address
	}
	for _, id := range plan.Promote {
		if err := n.raft.AddVoter(raft.ServerID(id), addr[id], 0, 5*time.Second).Error(); err != nil {
			n.log.Warn("autopilot: promotion failed", "member", id, "err", err)
			continue
		}
		n.log.Info("autopilot: promoted to voter after its stabilization time", "member", id, "stabilization", n.cfg.StabilizationTime.String())
	}
	for _, id := range plan.Remove {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := n.removeMember(ctx, id)
		cancel()
		if err != nil {
			n.log.Warn("autopilot: removing a dead member failed", "member", id, "err", err)
			continue
		}
		n.log.Warn("autopilot: removed a member unreachable for too long", "member", id, "after", n.cfg.DeadMemberAfter.String())
	}
}
