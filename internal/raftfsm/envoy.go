package raftfsm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// Envoy domain entries. They are not ignorable: a node that skipped them
// would serve other limits than its peers, and its snapshots would lose
// the domains.
const (
	entryPutEnvoyDomain    byte = 0x18 // raftv1.PutEnvoyDomain
	entryDeleteEnvoyDomain byte = 0x19 // raftv1.DeleteEnvoyDomain
	entrySyncEnvoyDomains  byte = 0x1a // raftv1.SyncEnvoyDomains
)

// ErrEnvoyDomainNotFound means no Envoy domain has the name.
var ErrEnvoyDomainNotFound = errors.New("envoy domain not found")

// EnvoyDomain is one domain of envoyproxy/ratelimit configuration as the
// cluster stores it. The FSM keeps its YAML unparsed: it is validated where
// it enters the cluster (envoyrls.ParseDomain in the server), and the
// server parses what the FSM holds, so the FSM depends on no Envoy code.
type EnvoyDomain struct {
	Name string
	YAML string
	// Version is the Raft index of its last change.
	Version uint64
	// Author is the principal that wrote it, or "file:NAME" / "xds:…".
	Author string
	// Source is the file or xDS resource it came from.
	Source string
}

// EnvoyDomains is the stored set of Envoy domains as of one applied entry.
type EnvoyDomains struct {
	// Index is the Raft index of the set's last change (0: never set).
	Index uint64
	// Domains are sorted by name.
	Domains []EnvoyDomain
}

// The decoded entries.
type (
	putEnvoyDomain struct {
		domain   EnvoyDomain
		expected *uint64
		timeNs   int64 // for the history (envoyhistory.go)
	}
	deleteEnvoyDomain struct {
		name      string
		expected  *uint64
		timeNs    int64
		principal string
	}
	syncEnvoyDomains struct {
		origin  string
		domains []EnvoyDomain
		timeNs  int64
	}
)

func envoyToPB(d EnvoyDomain) *raftv1.EnvoyDomain {
	return &raftv1.EnvoyDomain{Name: d.Name, Yaml: d.YAML, Version: d.Version, Author: d.Author, Source: d.Source}
}

func envoyFromPB(m *raftv1.EnvoyDomain) EnvoyDomain {
	return EnvoyDomain{Name: m.GetName(), YAML: m.GetYaml(), Version: m.GetVersion(), Author: m.GetAuthor(), Source: m.GetSource()}
}

func decodePutEnvoyDomain(p []byte) (putEnvoyDomain, error) {
	var m raftv1.PutEnvoyDomain
	if err := proto.Unmarshal(p, &m); err != nil {
		return putEnvoyDomain{}, err
	}
	if m.Domain.GetName() == "" {
		return putEnvoyDomain{}, errors.New("no domain name")
	}
	return putEnvoyDomain{domain: envoyFromPB(m.Domain), expected: copyU64(m.ExpectedVersion), timeNs: m.TimeUnixNs}, nil
}

func decodeDeleteEnvoyDomain(p []byte) (deleteEnvoyDomain, error) {
	var m raftv1.DeleteEnvoyDomain
	if err := proto.Unmarshal(p, &m); err != nil {
		return deleteEnvoyDomain{}, err
	}
	return deleteEnvoyDomain{name: m.Name, expected: copyU64(m.ExpectedVersion), timeNs: m.TimeUnixNs, principal: m.Principal}, nil
}

func decodeSyncEnvoyDomains(p []byte) (syncEnvoyDomains, error) {
	var m raftv1.SyncEnvoyDomains
	if err := proto.Unmarshal(p, &m); err != nil {
		return syncEnvoyDomains{}, err
	}
	if m.Origin == "" {
		return syncEnvoyDomains{}, errors.New("no origin")
	}
	e := syncEnvoyDomains{origin: m.Origin, domains: make([]EnvoyDomain, 0, len(m.Domains)), timeNs: m.TimeUnixNs}
	seen := map[string]bool{}
	for _, d := range m.Domains {
		if d.GetName() == "" || seen[d.GetName()] {
			return syncEnvoyDomains{}, fmt.Errorf("domain %q empty or twice", d.GetName())
		}
		seen[d.GetName()] = true
		e.domains = append(e.domains, envoyFromPB(d))
	}
	return e, nil
}

// checkVersion is the compare-and-set of an Envoy domain write.
func (s *fsmState) checkEnvoyVersion(name string, expected *uint64) error {
	if expected == nil {
		return nil
	}
	var cur uint64
	if d, ok := s.Envoy[name]; ok {
		cur = d.Version
	}
	if cur != *expected {
		return fmt.Errorf("envoy domain %q is at version %d, not %d: %w", name, cur, *expected, rule.ErrVersionMismatch)
	}
	return nil
}

func (s *fsmState) putEnvoyDomain(index uint64, e putEnvoyDomain) (applyResult, ruleChange) {
	if err := s.checkEnvoyVersion(e.domain.Name, e.expected); err != nil {
		return applyResult{err: err}, ruleChange{}
	}
	d := e.domain
	d.Version = index
	s.Envoy = maps.Clone(s.Envoy)
	if s.Envoy == nil {
		s.Envoy = map[string]EnvoyDomain{}
	}
	s.Envoy[d.Name] = d
	s.EnvoyIndex = index
	s.recordEnvoyPut(d, ChangePut, e.timeNs)
	return applyResult{envoy: &d}, ruleChange{}
}

func (s *fsmState) deleteEnvoyDomain(index uint64, e deleteEnvoyDomain) (applyResult, ruleChange) {
	if _, ok := s.Envoy[e.name]; !ok {
		return applyResult{err: fmt.Errorf("envoy domain %q: %w", e.name, ErrEnvoyDomainNotFound)}, ruleChange{}
	}
	if err := s.checkEnvoyVersion(e.name, e.expected); err != nil {
		return applyResult{err: err}, ruleChange{}
	}
	s.Envoy = maps.Clone(s.Envoy)
	delete(s.Envoy, e.name)
	s.EnvoyIndex = index
	s.recordEnvoyDelete(index, e.name, e.principal, ChangeDelete, e.timeNs)
	return applyResult{}, ruleChange{}
}

func (s *fsmState) syncEnvoyDomains(index uint64, e syncEnvoyDomains) (applyResult, ruleChange) {
	next := maps.Clone(s.Envoy)
	if next == nil {
		next = map[string]EnvoyDomain{}
	}
	changed := 0
	want := map[string]bool{}
	var put []EnvoyDomain
	var deleted []string
	for _, d := range e.domains {
		want[d.Name] = true
		if old, ok := next[d.Name]; ok && old.YAML == d.YAML && old.Source == d.Source && old.Author == d.Author {
			continue
		}
		d.Version = index
		next[d.Name] = d
		put = append(put, d)
		changed++
	}
	for name, d := range next {
		if !want[name] && strings.HasPrefix(d.Author, e.origin) {
			delete(next, name)
			deleted = append(deleted, name)
			changed++
		}
	}
	if changed > 0 {
		s.Envoy = next
		s.EnvoyIndex = index
		sort.Strings(deleted) // map order: every replica records the same
		for _, d := range put {
			s.recordEnvoyPut(d, ChangeSync, e.timeNs)
		}
		for _, name := range deleted {
			s.recordEnvoyDelete(index, name, e.origin, ChangeSync, e.timeNs)
		}
	}
	return applyResult{changed: changed}, ruleChange{}
}

// envoyDomains lists the state's domains sorted by name.
func (s *fsmState) envoyDomains() EnvoyDomains {
	out := EnvoyDomains{Index: s.EnvoyIndex, Domains: make([]EnvoyDomain, 0, len(s.Envoy))}
	for _, d := range s.Envoy {
		out.Domains = append(out.Domains, d)
	}
	sort.Slice(out.Domains, func(i, j int) bool { return out.Domains[i].Name < out.Domains[j].Name })
	return out
}

// EnvoyDomains is the set of Envoy domains as of the last applied entry.
func (f *FSM) EnvoyDomains() EnvoyDomains { return f.state.Load().envoyDomains() }

// EnvoyIndex is the Raft index of the last change to the Envoy domains: a
// cheap check whether EnvoyDomains changed.
func (f *FSM) EnvoyIndex() uint64 { return f.state.Load().EnvoyIndex }

// EnvoyDomains is the local copy of the Envoy domains (no leader read).
func (n *Node) EnvoyDomains() EnvoyDomains { return n.fsm.EnvoyDomains() }

// EnvoyIndex is the Raft index of the last change to the local copy.
func (n *Node) EnvoyIndex() uint64 { return n.fsm.EnvoyIndex() }

// PutEnvoyDomain writes one domain on the leader (elsewhere a
// *rule.LeaderError), with an optional compare-and-set on its version. The
// caller has validated d's YAML; its Version is set by the FSM.
func (n *Node) PutEnvoyDomain(ctx context.Context, d EnvoyDomain, expected *uint64) (EnvoyDomain, error) {
	if d.Name == "" {
		return EnvoyDomain{}, rule.Invalid("envoy domain: empty name")
	}
	entry, err := encodeEntry(entryPutEnvoyDomain, &raftv1.PutEnvoyDomain{Domain: envoyToPB(d), ExpectedVersion: expected, TimeUnixNs: time.Now().UnixNano()})
	if err != nil {
		return EnvoyDomain{}, err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return EnvoyDomain{}, err
	}
	if res.err != nil {
		return EnvoyDomain{}, res.err
	}
	return *res.envoy, nil
}

// DeleteEnvoyDomain deletes one domain on the leader, like PutEnvoyDomain.
func (n *Node) DeleteEnvoyDomain(ctx context.Context, name string, expected *uint64) error {
	if name == "" {
		return rule.Invalid("envoy domain: empty name")
	}
	entry, err := encodeEntry(entryDeleteEnvoyDomain, &raftv1.DeleteEnvoyDomain{Name: name, ExpectedVersion: expected, TimeUnixNs: time.Now().UnixNano(), Principal: authorOf(ctx)})
	if err != nil {
		return err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return err
	}
	return res.err
}

// SyncEnvoyDomains makes the domains whose author starts with origin
// exactly ds, as one entry (see raftv1.SyncEnvoyDomains), on the leader;
// it returns how many domains changed. Nothing is proposed when nothing
// would change.
func (n *Node) SyncEnvoyDomains(ctx context.Context, origin string, ds []EnvoyDomain) (int, error) {
	if origin == "" {
		return 0, rule.Invalid("envoy sync: empty origin")
	}
	if !n.IsLeader() {
		if err := n.awaitLeader(ctx); err != nil {
			return 0, err
		}
	}
	if !envoySyncChanges(n.fsm.state.Load(), origin, ds) {
		return 0, nil
	}
	m := &raftv1.SyncEnvoyDomains{Origin: origin, Domains: make([]*raftv1.EnvoyDomain, len(ds)), TimeUnixNs: time.Now().UnixNano()}
	for i, d := range ds {
		m.Domains[i] = envoyToPB(d)
	}
	entry, err := encodeEntry(entrySyncEnvoyDomains, m)
	if err != nil {
		return 0, err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return 0, err
	}
	return res.changed, res.err
}

// envoySyncChanges reports whether a sync of ds under origin would change s.
func envoySyncChanges(s *fsmState, origin string, ds []EnvoyDomain) bool {
	c := s.clone()
	c.Envoy = s.Envoy
	res, _ := c.syncEnvoyDomains(s.Index+1, syncEnvoyDomains{origin: origin, domains: ds})
	return res.changed > 0
}

// GetEnvoyDomain is a current read of one domain on the leader.
func (n *Node) GetEnvoyDomain(ctx context.Context, name string) (EnvoyDomain, error) {
	if err := n.consistent(ctx); err != nil {
		return EnvoyDomain{}, err
	}
	d, ok := n.fsm.state.Load().Envoy[name]
	if !ok {
		return EnvoyDomain{}, fmt.Errorf("envoy domain %q: %w", name, ErrEnvoyDomainNotFound)
	}
	return d, nil
}

// ListEnvoyDomains is a current read of every domain on the leader.
func (n *Node) ListEnvoyDomains(ctx context.Context) (EnvoyDomains, error) {
	if err := n.consistent(ctx); err != nil {
		return EnvoyDomains{}, err
	}
	return n.fsm.EnvoyDomains(), nil
}

// envoySnapshot is the snapshot's part of the Envoy domains, sorted.
func envoySnapshot(s *fsmState) ([]*raftv1.EnvoyDomain, uint64) {
	ds := s.envoyDomains()
	if len(ds.Domains) == 0 {
		return nil, ds.Index
	}
	out := make([]*raftv1.EnvoyDomain, len(ds.Domains))
	for i, d := range ds.Domains {
		out[i] = envoyToPB(d)
	}
	return out, ds.Index
}

// loadEnvoySnapshot reads the snapshot's Envoy domains into s (a snapshot
// of a release without them has none).
func (s *fsmState) loadEnvoySnapshot(ds []*raftv1.EnvoyDomain, index uint64) error {
	s.EnvoyIndex = index
	if len(ds) == 0 {
		return nil
	}
	s.Envoy = make(map[string]EnvoyDomain, len(ds))
	for _, m := range ds {
		if m.GetName() == "" {
			return errors.New("an envoy domain without a name")
		}
		if _, dup := s.Envoy[m.GetName()]; dup {
			return fmt.Errorf("envoy domain %q twice", m.GetName())
		}
		s.Envoy[m.GetName()] = envoyFromPB(m)
	}
	return nil
}
