package shard

import (
	"errors"
	"fmt"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// Errors of Commit. Each is wrapped with context; test with errors.Is.
var (
	// ErrGrantNotFound means the grant id was not minted for this rule
	// generation and key by this node or a node the key moved from
	// (Map.AddIssuers): unknown, of another key or rule, or of a rule
	// deleted since. Nothing changed.
	ErrGrantNotFound = errors.New("grant not found")
	// ErrGrantExpired means the grant's reservation TTL has passed: it
	// stays charged at its estimate, and nothing changed.
	ErrGrantExpired = errors.New("grant expired")
)

// CommitResult is the answer to Commit.
type CommitResult struct {
	bucket.CommitResult
	// Settled is false when the grant had been committed or refilled
	// before: a retried commit, which changed nothing.
	Settled bool
}

// Commit settles the reservation named by grantID at used permits (see
// bucket.Bucket.Commit): less than reserved gives the difference back,
// more charges the extra even past zero (debt). A grant is settled at
// most once, by a commit or a refill (the refill record is shared): a
// retried commit changes nothing and answers the current state with
// Settled false. Errors change nothing: rule.ErrInvalid for used < 0, a
// malformed id or an algorithm without commits (bucket.ErrNoCommit);
// ErrGrantNotFound for a grant of another rule or key, or of a node
// whose issuer this Map does not hold (a grant of a node the key moved
// from is accepted as Refill accepts it: AddIssuers);
// ErrGrantExpired once the rule's reservation window (Rule.ReservationTTL,
// by default the window) has passed since the grant; ErrBucketCap when the
// key's bucket had been evicted and cannot be made again, or its record
// of settled grants is full; ErrMoved when the bucket was handed over to
// the key's new owner (HandOver), where the grant is settled instead.
func (m *Map) Commit(c *rule.Compiled, key, grantID string, used int64, now int64) (CommitResult, error) {
	if used < 0 {
		return CommitResult{}, rule.Invalid("used must be >= 0, got %d", used)
	}
	g, err := parseGrant(grantID)
	if err != nil {
		return CommitResult{}, err
	}
	if c, err = current(c); err != nil {
		return CommitResult{}, err
	}
	cfg := c.ConfigFor(key)
	if !bucket.OffersCommit(cfg.Algorithm) {
		return CommitResult{}, rule.Invalid("rule %q is %s, which takes no commit: %v", c.Rule.Name, cfg.Algorithm, bucket.ErrNoCommit)
	}
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	bk := bucketKey(arr[:0], c.Rule.Name, key)
	if !m.open(&g, bk, c.Rule.Generation) { // this node's grants or a moved key's (export.go)
		if _, moved := m.Held(c.Rule.Name, key); moved {
			// Perhaps a grant of the new owner, whose keys this node
			// does not hold: it is settled there.
			return CommitResult{}, fmt.Errorf("key %q of rule %q: %w", key, c.Rule.Name, ErrMoved)
		}
		return CommitResult{}, fmt.Errorf("grant %q is not a grant of rule %q and key %q on this node nor on a node the key moved from (or the rule was recreated since): %w", grantID, c.Rule.Name, key, ErrGrantNotFound)
	}
	window := c.Rule.ReservationWindow(cfg)
	if now >= addSat(g.IssuedAt, window) {
		return CommitResult{}, fmt.Errorf("grant %q was made %v ago, past the reservation TTL %v of rule %q: it stays charged at its estimate of %d, nothing changed: %w",
			grantID, time.Duration(now-g.IssuedAt), time.Duration(window), c.Rule.Name, g.Permits, ErrGrantExpired)
	}
	overrun := max(0, used-g.Permits)
	sh, h := m.shardOf(bk)
	var e *entry
	if overrun == 0 {
		if e = m.lookup(sh, h, bk); e == nil {
			// Evicted: back at its initial state, nothing to give back
			// and nothing to charge.
			r, _ := bucket.New(cfg, now).Debit(cfg, now, 0)
			return CommitResult{CommitResult: r, Settled: true}, nil
		}
	} else if e, err = m.lookupOrCreate(sh, h, bk, c, cfg, nil, now); err != nil {
		return CommitResult{}, err
	}
	defer e.mu.Unlock()
	if e.moved {
		return CommitResult{}, errMoved(e, c) // settled where the state went (export.go)
	}
	if c, err = m.resolve(e, c, key, now); err != nil {
		return CommitResult{}, err
	}
	if e.rule.Rule.Generation != c.Rule.Generation {
		return CommitResult{}, fmt.Errorf("grant %q is of an earlier generation of rule %q: %w", grantID, c.Rule.Name, ErrGrantNotFound)
	}
	cfg = e.config(key)
	m.follow(e, cfg, now)
	if w := c.Rule.ReservationWindow(cfg); w != window {
		// The bucket is under a request's limit, of another window.
		if window = w; now >= addSat(g.IssuedAt, window) {
			return CommitResult{}, fmt.Errorf("grant %q was made %v ago, past the reservation TTL %v of rule %q: it stays charged at its estimate of %d, nothing changed: %w",
				grantID, time.Duration(now-g.IssuedAt), time.Duration(window), c.Rule.Name, g.Permits, ErrGrantExpired)
		}
	}
	if e.refilled.has(g.Nonce) {
		r, _ := e.b.Debit(cfg, now, 0)
		return CommitResult{CommitResult: r}, nil
	}
	before := e.refilled.bytes()
	full := m.budget > 0 && m.used.Load() >= m.budget
	if !e.refillOnce(g.Nonce, g.IssuedAt, max(window, validity(cfg)), now, !full) {
		m.charge(c, e.refilled.bytes()-before)
		return CommitResult{}, fmt.Errorf("key %q of rule %q holds too many settled grants to record another: %w", key, c.Rule.Name, ErrBucketCap)
	}
	m.charge(c, e.refilled.bytes()-before)
	var r bucket.CommitResult
	if g.Nonce < e.first {
		// The grant belongs to an earlier bucket of the key, evicted since
		// (back at its initial state): nothing of it is here to give
		// back, but an overrun is charged all the same.
		r, err = e.b.Debit(cfg, now, overrun)
	} else {
		r, err = e.b.Commit(cfg, now, bucket.Grant{IssuedAt: g.IssuedAt, Permits: g.Permits, LeaseID: g.Nonce}, used)
	}
	if err != nil {
		return CommitResult{}, rule.Invalid("commit: %v", err)
	}
	return CommitResult{CommitResult: r, Settled: true}, nil
}

// has reports whether nonce is in the record.
func (l *refillLog) has(nonce uint64) bool {
	if l == nil {
		return false
	}
	for _, n := range l.nonces {
		if n == nonce {
			return true
		}
	}
	return false
}

// Debit charges n >= 0 permits on the bucket of (c, key) that had no
// reservation, even past what it holds (bucket.Bucket.Debit: the debt is
// repaid before anything else is granted), creating the bucket against
// the caps when n > 0: a commit without a reservation, on the same
// accounting as Acquire and Commit. It is Envoy's hits_addend on the
// response path, for the algorithms that take commits; others are
// rule.ErrInvalid. A bucket handed over (HandOver) is ErrMoved.
func (m *Map) Debit(c *rule.Compiled, key string, n int64, now int64) (bucket.CommitResult, error) {
	if n < 0 {
		return bucket.CommitResult{}, rule.Invalid("debit must be >= 0, got %d", n)
	}
	c, err := current(c)
	if err != nil {
		return bucket.CommitResult{}, err
	}
	cfg := c.ConfigFor(key)
	if !bucket.OffersCommit(cfg.Algorithm) {
		return bucket.CommitResult{}, rule.Invalid("rule %q is %s, which takes no debit: %v", c.Rule.Name, cfg.Algorithm, bucket.ErrNoCommit)
	}
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	bk := bucketKey(arr[:0], c.Rule.Name, key)
	sh, h := m.shardOf(bk)
	var e *entry
	if n == 0 {
		if e = m.lookup(sh, h, bk); e == nil {
			return bucket.New(cfg, now).Debit(cfg, now, 0)
		}
	} else if e, err = m.lookupOrCreate(sh, h, bk, c, cfg, nil, now); err != nil {
		return bucket.CommitResult{}, err
	}
	defer e.mu.Unlock()
	if e.moved { // handed over: its new owner counts (as decide refuses)
		return bucket.CommitResult{}, errMoved(e, c)
	}
	if c, err = m.resolve(e, c, key, now); err != nil {
		return bucket.CommitResult{}, err
	}
	cfg = e.config(key)
	m.follow(e, cfg, now)
	before := e.bytes()
	r, err := e.b.Debit(cfg, now, n)
	m.charge(c, e.bytes()-before)
	if err != nil {
		return bucket.CommitResult{}, rule.Invalid("debit: %v", err)
	}
	return r, nil
}
