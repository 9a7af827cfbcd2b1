package server

// The wiring of auth's revocation to the node: the membership a peer's
// certificate is checked against, and the Recheck of live streams after a
// membership change or a TLS reload.

import (
	"maps"
	"sync/atomic"
	"time"
)

// Membership is the set of node ids in the Raft configuration, as
// auth.Options.Members reads it. cmd/tokenserver makes one before the
// Authenticator (which needs it) and the node (which keeps it current),
// and passes it to both. Until the node first reads its configuration
// every id is a member, as for a node without Raft. The zero value is
// ready to use and safe for simultaneous use.
type Membership struct {
	ids atomic.Pointer[map[string]struct{}]
}

// Contains reports whether id is in the Raft configuration; true while
// the node has not read one yet.
func (m *Membership) Contains(id string) bool {
	if m == nil {
		return true
	}
	set := m.ids.Load()
	if set == nil {
		return true
	}
	_, ok := (*set)[id]
	return ok
}

// set replaces the members and reports whether they changed.
func (m *Membership) set(ids []string) bool {
	next := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		next[id] = struct{}{}
	}
	old := m.ids.Swap(&next)
	return old == nil || !maps.Equal(*old, next)
}

// membershipPoll bounds how stale the membership can be: a Raft
// configuration change that moves no member in or out of the routing view
// (a removal after its drain) is seen at the next poll.
const membershipPoll = time.Second

// watchAuth keeps Security.Members current and ends the streams of
// principals that went away: it re-reads the Raft configuration at each
// routing view change and every membershipPoll, and calls Recheck when the
// members changed or the TLS files were reloaded (a deny list).
func (n *Node) watchAuth() {
	defer n.wg.Done()
	t := time.NewTicker(membershipPoll)
	defer t.Stop()
	var gen uint64
	if n.cfg.Security.tlsOn() {
		gen = n.cfg.Security.TLS.Generation()
	}
	for {
		vch := n.data.ViewChanged()
		changed := n.refreshMembers()
		if n.cfg.Security.tlsOn() {
			if g := n.cfg.Security.TLS.Generation(); g != gen {
				gen, changed = g, true
			}
		}
		if changed && n.auth != nil {
			n.auth.Recheck()
		}
		select {
		case <-n.done:
			return
		case <-vch:
		case <-t.C:
		}
	}
}

// refreshMembers reads the Raft configuration into Security.Members and
// reports whether it changed. An error (Raft shutting down) keeps the
// previous members.
func (n *Node) refreshMembers() bool {
	m := n.cfg.Security.Members
	if m == nil {
		return false
	}
	st, err := n.control.Status()
	if err != nil || len(st.Members) == 0 {
		return false
	}
	ids := make([]string, len(st.Members))
	for i, s := range st.Members {
		ids[i] = s.ID
	}
	return m.set(ids)
}
