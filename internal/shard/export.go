package shard

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/grant"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// BucketState is one bucket as it travels to another node when its key
// moves (internal/handoff): the algorithm state, the penalty, the grant
// numbering and the grants already given back. Times are relative to the
// exporter's now.
type BucketState struct {
	Rule       string
	Generation uint64
	Key        string
	// Seq is the bucket's last grant nonce, First its first: the importer
	// goes on numbering from Seq, so that ids never repeat.
	Seq, First uint64
	// PenaltyLeft is what remains of the penalty lock-out (0: none).
	PenaltyLeft int64
	// State is bucket.MarshalState's encoding.
	State []byte
	// Refilled are the grants already given back, RefillFloor the floor
	// of the record (relative); see refillLog.
	Refilled    []RefilledGrant
	RefillFloor int64
	// Inline is the limit the bucket is judged by when the request that
	// last acquired from it carried one (Map.AcquireInline): State is
	// encoded under it, and the importer judges the bucket by it until
	// another acquire brings another limit or none. nil: the rule's
	// configuration for the key (and all a sender older than this field
	// sends).
	Inline *rule.InlineLimit
	// Frozen marks the HandOver that exported the bucket (0 for Export
	// and ExportKey): DropFrozen takes it back once the new owner holds
	// the state. It stays on this node (it is not part of the state).
	Frozen uint64
}

// RefilledGrant is one grant already given back, forgotten after
// ExpiresIn (relative to the exporter's now).
type RefilledGrant struct {
	Nonce     uint64
	ExpiresIn int64
}

// Issuer is another node's grant keys, accepted here once a key moved from
// it: Offset maps its clock to this node's (IssuedAt + Offset).
type Issuer struct {
	Keys   grant.Keys
	Offset int64
}

// MaxIssuers bounds the foreign grant issuers a Map accepts; the oldest
// is forgotten first (its grants then change nothing when given back,
// which never over-admits).
const MaxIssuers = 16

// issuers are the grant keys of the nodes keys moved from. The zero value
// is empty and ready.
type issuers struct {
	mu   sync.RWMutex
	list []Issuer
}

// Issuers returns the grant issuers whose grants this Map accepts, its own
// first (offset 0), then those it imported: what a node sends along with
// buckets it hands over.
func (m *Map) Issuers() []Issuer {
	m.imported.mu.RLock()
	defer m.imported.mu.RUnlock()
	return append([]Issuer{{Keys: m.keys}}, m.imported.list...)
}

// AddIssuers accepts the grants of is from now on (each Offset already
// mapped to this node's clock), keeping at most MaxIssuers, newest first.
func (m *Map) AddIssuers(is []Issuer) {
	m.imported.mu.Lock()
	defer m.imported.mu.Unlock()
	for _, in := range is {
		if in.Keys == m.keys {
			continue
		}
		kept := []Issuer{in}
		for _, o := range m.imported.list {
			if o.Keys != in.Keys {
				kept = append(kept, o)
			}
		}
		m.imported.list = kept[:min(len(kept), MaxIssuers)]
	}
}

// open is Keys.Open under this Map's keys, then under the imported
// issuers', whose grants' times it maps to this node's clock.
func (m *Map) open(g *grant.Grant, bk []byte, gen uint64) bool {
	orig := *g
	if m.keys.Open(g, bk, gen) {
		return true
	}
	m.imported.mu.RLock()
	defer m.imported.mu.RUnlock()
	for i := range m.imported.list {
		in := &m.imported.list[i]
		*g = orig
		if in.Keys.Open(g, bk, gen) {
			g.IssuedAt += in.Offset
			return true
		}
	}
	*g = orig
	return false
}

// Has reports whether the Map holds a bucket for key under the rule named
// ruleName (of any generation) that it decides on: one it handed over
// (HandOver) does not count.
func (m *Map) Has(ruleName, key string) bool {
	held, moved := m.Held(ruleName, key)
	return held && !moved
}

// Held reports whether the Map holds a bucket for key under the rule
// named ruleName (of any generation), and whether it handed that bucket
// over (HandOver).
func (m *Map) Held(ruleName, key string) (held, moved bool) {
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	bk := bucketKey(arr[:0], ruleName, key)
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e == nil {
		return false, false
	}
	defer e.mu.Unlock()
	return true, e.moved
}

// ErrMoved is the error of a decision on a bucket this Map handed over to
// the key's new owner (HandOver): the caller sends the decision there.
var ErrMoved = errors.New("the bucket was handed over to the key's new owner")

// errMoved is ErrMoved for e under rule c; e.mu is held.
func errMoved(e *entry, c *rule.Compiled) error {
	return fmt.Errorf("key %q of rule %q: %w", e.key[len(c.Rule.Name)+1:], c.Rule.Name, ErrMoved)
}

// Export calls fn with the state of every bucket whose key moved says
// moved, as of now, one bucket locked at a time (fn must not call the
// Map). It stops at fn's first error. A bucket stays here: until its key
// is routed elsewhere everywhere, a call that still lands here is decided
// on the same state.
func (m *Map) Export(now int64, moved func(ruleName, key string) bool, fn func(BucketState) error) error {
	return m.export(now, moved, false, fn)
}

// HandOver is Export for a handoff: under the same lock as its export,
// each bucket is frozen, so that no decision here changes it after the
// state it handed over (a decision on it fails with ErrMoved) and the
// new owner's count is exact. A bucket frozen already is not exported
// again (its handoff sends what it froze). Import of the key, or Thaw,
// unfreezes it.
func (m *Map) HandOver(now int64, moved func(ruleName, key string) bool, fn func(BucketState) error) error {
	return m.export(now, moved, true, fn)
}

// Thaw unfreezes the bucket of key under ruleName that HandOver froze:
// the key came back here and no newer state will come (its handoff
// failed), so it goes on from the state it had when it left, never from a
// fresh bucket. It reports whether there was such a bucket.
func (m *Map) Thaw(ruleName, key string) bool {
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	bk := bucketKey(arr[:0], ruleName, key)
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e == nil {
		return false
	}
	defer e.mu.Unlock()
	was := e.moved
	e.moved = false
	return was
}

func (m *Map) export(now int64, moved func(ruleName, key string) bool, freeze bool, fn func(BucketState) error) error {
	var mark uint64
	if freeze {
		mark = m.freezes.Add(1)
	}
	for i := range m.shards {
		tab := m.shards[i].tab.Load()
		for j := range tab.slots {
			e := tab.slots[j].Load()
			if e == nil || e == tombstone {
				continue
			}
			e.mu.Lock()
			if e.rule == nil {
				e.mu.Unlock()
				continue
			}
			name := e.rule.Rule.Name
			key := e.key[len(name)+1:]
			if (freeze && e.moved) || !moved(name, key) {
				e.mu.Unlock()
				continue
			}
			s, err := e.export(key, now)
			if err == nil && freeze {
				e.moved, e.frozen, s.Frozen = true, mark, mark
			}
			e.mu.Unlock()
			if err != nil {
				return err
			}
			if err := fn(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// export encodes e under the configuration it is judged by (a request's
// limit, which travels along, or its rule's); e.mu is held.
func (e *entry) export(key string, now int64) (BucketState, error) {
	cfg := e.config(key)
	st, err := bucket.MarshalState(cfg, e.b, now)
	if err != nil {
		return BucketState{}, fmt.Errorf("export %q: %w", e.key, err)
	}
	s := BucketState{Rule: e.rule.Rule.Name, Generation: e.rule.Rule.Generation, Key: key, Seq: e.seq, First: e.first,
		PenaltyLeft: max(0, e.penaltyUntil-now), State: st}
	if cfg == e.inl {
		s.Inline = &rule.InlineLimit{Algorithm: cfg.Algorithm, Limit: cfg.Limit, Period: time.Duration(cfg.Period), Burst: cfg.Burst}
	}
	if l := e.refilled; l != nil {
		s.RefillFloor = l.floor - now
		for i, n := range l.nonces {
			if l.expires[i] > now {
				s.Refilled = append(s.Refilled, RefilledGrant{Nonce: n, ExpiresIn: l.expires[i] - now})
			}
		}
	}
	return s, nil
}

// Import installs s, exported by another node, as of now, under the rule
// of t it belongs to, or, for a rule t does not hold, the one the Map's
// LocalRules compile (SetLocalRules); false (and nothing changed) when
// neither has such a rule generation any more. A state that carries a request's limit (Inline) is
// judged by it, as on the exporter, unless an override of the key applies
// here (the override wins, as for an acquire). Where this Map already
// holds the key (a call that landed here before the state did, or a
// bucket left from an earlier ownership), the bucket with fewer permits
// left is kept, with the configuration that judges it, so that an import
// never hands out more than either side would: grant numbering, penalty
// and the record of settled (refilled or committed) grants are merged,
// and when s's state is kept, its grants (leases included) are honoured
// here however the two buckets numbered theirs. Concurrency buckets are
// merged instead, lease by lease (leasemerge.go): every lease granted on
// either side is in flight and is released here.
func (m *Map) Import(t *rule.Table, s BucketState, now int64) (bool, error) {
	c := t.Get(s.Rule)
	if c == nil {
		c = m.localRule(s.Rule) // a rule the node makes itself (SetLocalRules)
	}
	if c == nil || c.Rule.Generation != s.Generation {
		return false, nil
	}
	if len(s.Key) > rule.MaxKeyLen {
		return false, rule.Invalid("key of %d bytes is above %d", len(s.Key), rule.MaxKeyLen)
	}
	b, src, own, err := importState(c, s, now)
	if err != nil {
		return false, fmt.Errorf("import rule %q: %w", s.Rule, err)
	}
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	bk := bucketKey(arr[:0], c.Rule.Name, s.Key)
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e == nil {
		if e, err = m.lookupOrCreate(sh, h, bk, c, c.ConfigFor(s.Key), own, now); err != nil {
			return false, fmt.Errorf("import rule %q: %w", s.Rule, err)
		}
		if e.seq == e.first-1 && s.First != 0 { // made for this import: the grants of the moved bucket are its own
			e.first = s.First
		}
	}
	defer e.mu.Unlock()
	if e.rule.Rule.Generation != c.Rule.Generation {
		return false, nil // the key's bucket here is of another generation
	}
	v, err := m.resolve(e, c, s.Key, now)
	if err != nil {
		return false, err
	}
	if v != c { // the bucket here is judged by a newer version of the rule
		c = v
		if b, src, own, err = importState(c, s, now); err != nil {
			return false, fmt.Errorf("import rule %q: %w", s.Rule, err)
		}
	}
	before := e.bytes()
	peek := bucket.Request{}
	here := e.config(s.Key)
	keep := e.moved || b.Acquire(src, now, peek).Remaining <= e.b.Acquire(here, now, peek).Remaining
	if !e.moved && src.Algorithm == bucket.Concurrency && here.Algorithm == bucket.Concurrency {
		// Leases granted on either side are all in flight (leasemerge.go).
		to := here
		if keep {
			to = src
		}
		u, err := unionLeases(to, src, b, here, e.b, now)
		if err != nil {
			return false, fmt.Errorf("import rule %q: %w", s.Rule, err)
		}
		if keep {
			b = u
		} else {
			e.b = u
			if s.First != 0 { // the state's leases are released here too
				e.first = min(e.first, s.First)
			}
		}
	}
	if keep {
		// A bucket this Map handed over is stale: the state that comes
		// back is the key's.
		e.b = b
		if own != nil {
			if e.inl == nil || *e.inl != *own {
				e.inl = own
			}
			e.cfg = e.inl
		} else {
			e.cfg = src
		}
		e.stamp = nil // the next acquire looks its configuration up
		if s.First != 0 {
			// The grants of the state kept are honoured here: the
			// bucket's own numbering may have begun after theirs (the
			// exporter's clock is behind, a node restarted since).
			e.first = min(e.first, s.First)
		}
	}
	e.moved = false
	e.seq = max(e.seq, s.Seq)
	e.penaltyUntil = max(e.penaltyUntil, addSat(now, max(0, s.PenaltyLeft)))
	if len(s.Refilled) > 0 || s.RefillFloor != 0 {
		if e.refilled == nil {
			e.refilled = &refillLog{floor: now + s.RefillFloor}
		}
		l := e.refilled
		l.floor = max(l.floor, now+s.RefillFloor)
		for _, r := range s.Refilled {
			if len(l.nonces) >= maxRefillLog {
				break
			}
			if r.ExpiresIn > 0 {
				l.nonces = append(l.nonces, r.Nonce)
				l.expires = append(l.expires, addSat(now, r.ExpiresIn))
			}
		}
	}
	m.charge(c, e.bytes()-before)
	return true, nil
}

// importState decodes s's bucket as of now under c: under the request's
// limit s carries, when it does and no override of the key applies here
// (own is then that configuration, which the bucket keeps), else under
// c's configuration for the key, to which a bucket of a request's limit
// is resized as an acquire under the override would. src is the
// configuration that judges b.
func importState(c *rule.Compiled, s BucketState, now int64) (b bucket.Bucket, src, own *bucket.Config, err error) {
	src = c.ConfigFor(s.Key)
	if s.Inline == nil {
		b, err = bucket.UnmarshalState(src, s.State, now)
		return b, src, nil, err
	}
	inl, err := inlineConfig(c, *s.Inline)
	if err != nil {
		return nil, nil, nil, err
	}
	if b, err = bucket.UnmarshalState(&inl, s.State, now); err != nil {
		return nil, nil, nil, err
	}
	if src != &c.Config { // an override of the key wins over the request's limit
		if inl != *src {
			b.Reconfigure(&inl, src, now)
		}
		return b, src, nil, nil
	}
	return b, &inl, &inl, nil
}

// inlineConfig is the configuration a request's limit l gave a bucket
// under c on the node that exported it: c's default with l's limit,
// period and burst. It is not checked against c's inline policy, which
// judges requests: a bucket keeps the limit it was given until another
// acquire brings another, here as on the exporter.
func inlineConfig(c *rule.Compiled, l rule.InlineLimit) (bucket.Config, error) {
	cfg := c.Config
	if l.Algorithm != cfg.Algorithm {
		return bucket.Config{}, rule.Invalid("the state's limit is of algorithm %s, rule %q is %s", l.Algorithm, c.Rule.Name, cfg.Algorithm)
	}
	cfg.Limit, cfg.Period, cfg.Burst = l.Limit, int64(l.Period), l.Burst
	if cfg.Burst == 0 {
		cfg.Burst = cfg.Limit
	}
	if err := cfg.Validate(); err != nil {
		return bucket.Config{}, rule.Invalid("the state's limit under rule %q: %v", c.Rule.Name, err)
	}
	return cfg, nil
}
