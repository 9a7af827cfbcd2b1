package raftfsm

import (
	"errors"
	"fmt"
	"maps"
	"sort"
	"time"

	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// Envoy domain history: like rules' (history.go), the FSM keeps the last
// HistoryVersions versions of every Envoy domain, each with its principal
// (the writer, or "file:NAME" / "xds:…" for a watched source), the
// proposing leader's wall time carried in the entry, and the change. A
// deleted domain keeps its history for DeletedHistoryRetention of entry
// time. Envoy writes are rare, so the histories are copied on write: a
// state's map and its slices are never changed once another state may
// read them, and a dry run on a clone (envoySyncChanges) changes nothing.

// ChangeSync is the change of an Envoy domain written by a watched
// source (--envoy-config-dir, xDS).
const ChangeSync = "SYNC"

// EnvoyDomainVersion is one version in an Envoy domain's history.
type EnvoyDomainVersion struct {
	// Domain is the domain as written; nil for a deletion.
	Domain *EnvoyDomain
	// Version is the Raft index of the change.
	Version uint64
	// Principal wrote it.
	Principal string
	// Time is the proposing leader's wall clock (zero in entries of
	// releases before the history).
	Time time.Time
	// Change is ChangePut, ChangeDelete or ChangeSync.
	Change string
}

// envoyHistory is one domain's versions, oldest first, and while it is
// deleted the deletion's entry time.
type envoyHistory struct {
	versions  []EnvoyDomainVersion
	deletedNs int64
}

// recordEnvoy adds one version of name to s's histories (a new map and
// slice: copy-on-write) and forgets the histories of domains deleted
// longer than DeletedHistoryRetention before the entry's time.
func (s *fsmState) recordEnvoy(name string, v EnvoyDomainVersion, timeNs int64) {
	if timeNs != 0 {
		v.Time = time.Unix(0, timeNs).UTC()
	}
	next := maps.Clone(s.EnvoyHistory)
	if next == nil {
		next = map[string]envoyHistory{}
	}
	h := next[name]
	keep := h.versions
	if len(keep) >= HistoryVersions {
		keep = keep[len(keep)-HistoryVersions+1:]
	}
	h.versions = append(append(make([]EnvoyDomainVersion, 0, len(keep)+1), keep...), v)
	h.deletedNs = 0
	if v.Domain == nil {
		h.deletedNs = timeNs
	}
	next[name] = h
	if timeNs != 0 {
		for d, dh := range next {
			if d != name && dh.deletedNs != 0 && timeNs-dh.deletedNs > int64(DeletedHistoryRetention) {
				delete(next, d)
			}
		}
	}
	s.EnvoyHistory = next
}

// recordEnvoyPut records d (as stored, with its version) written by
// principal with change.
func (s *fsmState) recordEnvoyPut(d EnvoyDomain, change string, timeNs int64) {
	s.recordEnvoy(d.Name, EnvoyDomainVersion{Domain: &d, Version: d.Version, Principal: d.Author, Change: change}, timeNs)
}

// recordEnvoyDelete records the deletion of name at index.
func (s *fsmState) recordEnvoyDelete(index uint64, name, principal, change string, timeNs int64) {
	s.recordEnvoy(name, EnvoyDomainVersion{Version: index, Principal: principal, Change: change}, timeNs)
}

// EnvoyDomainHistory returns the stored versions of the Envoy domain name
// on this replica, newest first (nil when it has none). It reads local
// state: it may lag the leader by the entries not yet applied here.
func (n *Node) EnvoyDomainHistory(name string) []EnvoyDomainVersion {
	return n.fsm.state.Load().envoyDomainHistory(name)
}

func (s *fsmState) envoyDomainHistory(name string) []EnvoyDomainVersion {
	h := s.EnvoyHistory[name]
	out := make([]EnvoyDomainVersion, len(h.versions))
	for i, v := range h.versions {
		out[len(out)-1-i] = v
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// envoyHistoryToPB writes the histories for a snapshot, sorted by name.
func envoyHistoryToPB(hs map[string]envoyHistory) []*raftv1.EnvoyDomainHistory {
	out := make([]*raftv1.EnvoyDomainHistory, 0, len(hs))
	for name, h := range hs {
		m := &raftv1.EnvoyDomainHistory{Name: name, DeletedUnixNs: h.deletedNs, Versions: make([]*raftv1.EnvoyDomainVersion, len(h.versions))}
		for i, v := range h.versions {
			pv := &raftv1.EnvoyDomainVersion{Version: v.Version, Principal: v.Principal, Change: v.Change}
			if !v.Time.IsZero() {
				pv.TimeUnixNs = v.Time.UnixNano()
			}
			if v.Domain != nil {
				pv.Domain = envoyToPB(*v.Domain)
			}
			m.Versions[i] = pv
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if len(out) == 0 {
		return nil
	}
	return out
}

// envoyHistoryFromPB reads a snapshot's histories (none in snapshots of
// releases before them).
func envoyHistoryFromPB(ms []*raftv1.EnvoyDomainHistory) (map[string]envoyHistory, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	out := make(map[string]envoyHistory, len(ms))
	for _, m := range ms {
		if m.GetName() == "" {
			return nil, errors.New("an envoy domain history without a name")
		}
		if _, dup := out[m.GetName()]; dup {
			return nil, fmt.Errorf("history of envoy domain %q twice", m.GetName())
		}
		h := envoyHistory{deletedNs: m.GetDeletedUnixNs(), versions: make([]EnvoyDomainVersion, 0, len(m.GetVersions()))}
		for _, pv := range m.GetVersions() {
			v := EnvoyDomainVersion{Version: pv.GetVersion(), Principal: pv.GetPrincipal(), Change: pv.GetChange()}
			if pv.GetTimeUnixNs() != 0 {
				v.Time = time.Unix(0, pv.GetTimeUnixNs()).UTC()
			}
			if pv.Domain != nil {
				d := envoyFromPB(pv.Domain)
				v.Domain = &d
			}
			h.versions = append(h.versions, v)
		}
		out[m.GetName()] = h
	}
	return out, nil
}
