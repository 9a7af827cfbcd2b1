package client

// The client's cluster view: members, the rules' client-facing fields, and
// how a server's view updates them.

import (
	"slices"
	"strings"
	"time"

	"github.com/tokenserver/tokenserver/internal/cluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// viewState is one immutable cluster view as the client uses it.
type viewState struct {
	view  *cluster.View
	rules map[string]*ruleInfo
	byID  map[string]*node
	// departed names (pb.AvoidHeader) the members that left the view within
	// departedFor before departedUntil (client ns): a server whose view
	// still lists them sends their keys where this view does, instead of
	// to a member that may be frozen.
	departed      string
	departedUntil int64
}

// departedFor is how long members that left the view are named in the
// avoid header: longer than a view change takes to reach every server.
const departedFor = 5 * time.Second

// recentlyDeparted is st.departed while it is recent, else "".
func (st *viewState) recentlyDeparted(c *Client) string {
	if st.departed == "" || c.now() >= st.departedUntil {
		return ""
	}
	return st.departed
}

// owner returns the node that owns key in the current view, or nil.
func (st *viewState) owner(key string) *node {
	m, ok := st.view.Owner(key)
	if !ok {
		return nil
	}
	return st.byID[m.ID]
}

// ruleInfo is a rule's client-facing fields.
type ruleInfo struct {
	name      string
	algorithm pb.Algorithm
	limit     int64
	period    time.Duration
	burst     int64
	fbPolicy  FallbackPolicy
	fbLimit   int64
	leaseMax  int64
	leaseTTL  time.Duration
	version   uint64
}

// isHeartbeat reports whether a view from the followed stream is a
// heartbeat (pb.ViewHeartbeatHeader): no members, meaning "nothing
// changed", never "no rules". A whole view always names members: a node
// is ready only once it is in the view, and the rules of a node that is
// not ready are not taken anyway.
func isHeartbeat(pv *pb.ClusterView) bool { return len(pv.GetMembers()) == 0 }

// applyView takes what a server's view teaches: its members when its epoch
// is newer than the client's (epochs only grow), and its rules when the
// node that answered is ready. Never looser than the rules: a view from a
// node that is not ready changes no rule (it may not have replayed its
// log); a ready node's view from the followed stream (authoritative)
// replaces the rules, deletions included; one fetched by a probe only adds
// rules and newer versions. Nodes are dialed for new members, and closed
// when they leave (seeds stay).
func (c *Client) applyView(pv *pb.ClusterView, authoritative bool) {
	c.viewMu.Lock()
	defer c.viewMu.Unlock()
	old := c.state.Load()
	view := old.view
	if pv.GetEpoch() > old.view.Epoch || (old.view.Len() == 0 && len(pv.GetMembers()) > 0) {
		members := make([]cluster.Member, 0, len(pv.GetMembers()))
		for _, m := range pv.GetMembers() {
			members = append(members, cluster.Member{ID: m.GetId(), GRPCAddr: m.GetGrpcAddr(), RaftAddr: m.GetRaftAddr(), Voter: m.GetVoter()})
		}
		if nv := cluster.NewView(pv.GetEpoch(), members); nv.Len() > 0 {
			view = nv
		}
	}
	rules := old.rules
	if pv.GetReady() {
		rules = mergeRules(old.rules, pv.GetRules(), authoritative)
	}
	if view == old.view && sameRules(rules, old.rules) {
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	byID := old.byID
	departed, departedUntil := old.departed, old.departedUntil
	var gone []*node
	if view != old.view {
		var left []string
		for _, m := range old.view.Members() {
			if _, ok := view.Member(m.ID); !ok {
				left = append(left, m.ID)
			}
		}
		if prev := old.recentlyDeparted(c); prev != "" {
			for _, id := range strings.Split(prev, ",") {
				if _, ok := view.Member(id); !ok && !slices.Contains(left, id) {
					left = append(left, id)
				}
			}
		}
		departed, departedUntil = strings.Join(left, ","), c.now()+int64(departedFor)
		byID = make(map[string]*node, view.Len())
		keep := make(map[string]bool, view.Len()+len(c.seeds))
		for _, s := range c.seeds {
			keep[s] = true
		}
		for _, m := range view.Members() {
			n := c.nodes[m.GRPCAddr]
			if n == nil {
				var err error
				if n, err = newNode(c, m.GRPCAddr); err != nil {
					c.log.Error("tokenserver: cannot dial member", "member", m.ID, "addr", m.GRPCAddr, "err", err)
					continue
				}
				c.nodes[m.GRPCAddr] = n
			}
			byID[m.ID] = n
			keep[m.GRPCAddr] = true
		}
		for addr, n := range c.nodes {
			if !keep[addr] {
				delete(c.nodes, addr)
				gone = append(gone, n)
			}
		}
	}
	c.state.Store(&viewState{view: view, rules: rules, byID: byID, departed: departed, departedUntil: departedUntil})
	c.mu.Unlock()
	c.m.viewEpoch.Set(float64(view.Epoch))
	c.m.viewMembers.Set(float64(view.Len()))
	for _, n := range gone {
		c.retire(n)
	}
	c.updateMode()
}

// mergeRules returns old updated by a ready node's rules: replaced when
// authoritative, else only added to and moved to newer versions. It
// returns old itself, without allocating, when nothing changes (the
// heartbeat views of an idle cluster).
func mergeRules(old map[string]*ruleInfo, in []*pb.ClientRule, authoritative bool) map[string]*ruleInfo {
	same := !authoritative || len(in) == len(old)
	for _, r := range in {
		if !same {
			break
		}
		o := old[r.GetName()]
		same = o != nil && (*o == toRuleInfo(r) || (!authoritative && o.version >= r.GetVersion()))
	}
	if same {
		return old
	}
	out := make(map[string]*ruleInfo, max(len(old), len(in)))
	if !authoritative {
		for k, v := range old {
			out[k] = v
		}
	}
	for _, r := range in {
		ri := toRuleInfo(r)
		if o := old[ri.name]; o != nil && (*o == ri || (!authoritative && o.version >= ri.version)) {
			out[ri.name] = o
			continue
		}
		out[ri.name] = &ri
	}
	if sameRules(out, old) {
		return old
	}
	return out
}

// toRuleInfo is a view rule's client-facing fields.
func toRuleInfo(r *pb.ClientRule) ruleInfo {
	return ruleInfo{
		name: r.GetName(), algorithm: r.GetAlgorithm(), limit: r.GetLimit(), period: r.GetPeriod().AsDuration(),
		burst: r.GetBurst(), fbPolicy: FallbackPolicy(r.GetFallback().GetPolicy()), fbLimit: r.GetFallback().GetLimit(),
		leaseMax: r.GetLease().GetMaxBatch(), leaseTTL: r.GetLease().GetTtl().AsDuration(), version: r.GetVersion(),
	}
}

// sameRules reports whether a and b hold the same ruleInfo pointers.
func sameRules(a, b map[string]*ruleInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
