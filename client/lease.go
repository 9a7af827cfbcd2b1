package client

import (
	"context"
	"hash/maphash"
	"math"
	"sync"
	"time"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// hotCalls is how many calls per lease time make a key hot: past it, the
// key's calls are served from leases.
const hotCalls = 3

const keyShards = 32

// keyMap holds a leasing Limiter's per-key state in lock-striped shards,
// at most max keys.
type keyMap struct {
	seed     maphash.Seed
	perShard int
	shards   [keyShards]keyShard
}

type keyShard struct {
	mu sync.RWMutex
	m  map[string]*keyState
	_  [40]byte // keep shards on their own cache lines
}

func newKeyMap(maxKeys int) *keyMap {
	km := &keyMap{seed: maphash.MakeSeed(), perShard: max(1, maxKeys/keyShards)}
	for i := range km.shards {
		km.shards[i].m = map[string]*keyState{}
	}
	return km
}

func (km *keyMap) shard(key string) *keyShard {
	return &km.shards[maphash.String(km.seed, key)%keyShards]
}

// get returns key's state or nil.
func (km *keyMap) get(key string) *keyState {
	sh := km.shard(key)
	sh.mu.RLock()
	ks := sh.m[key]
	sh.mu.RUnlock()
	return ks
}

// getOrCreate returns key's state, creating it; nil when the shard is full
// of keys holding leases.
func (km *keyMap) getOrCreate(key string, now int64) (ks *keyState, created bool) {
	sh := km.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if ks := sh.m[key]; ks != nil {
		return ks, false
	}
	if len(sh.m) >= km.perShard && !sh.evictOne(now) {
		return nil, false
	}
	ks = &keyState{rateStart: now, winStart: now}
	sh.m[key] = ks
	return ks, true
}

// evictOne drops one key that holds no live lease and is not refreshing.
func (sh *keyShard) evictOne(now int64) bool {
	for k, ks := range sh.m {
		if !ks.mu.TryLock() {
			continue
		}
		idle := !ks.refreshing && (ks.tokens == 0 || now >= ks.expires) && now >= ks.deniedUntil
		ks.mu.Unlock()
		if idle {
			delete(sh.m, k)
			return true
		}
	}
	return false
}

// each calls f on every key state.
func (km *keyMap) each(f func(key string, ks *keyState)) {
	for i := range km.shards {
		sh := &km.shards[i]
		sh.mu.RLock()
		keys := make([]string, 0, len(sh.m))
		states := make([]*keyState, 0, len(sh.m))
		for k, ks := range sh.m {
			keys, states = append(keys, k), append(states, ks)
		}
		sh.mu.RUnlock()
		for j := range keys {
			f(keys[j], states[j])
		}
	}
}

// keyState is one key's lease, demand and remembered denial.
type keyState struct {
	mu sync.Mutex

	// The current lease: tokens left, valid until expires (client
	// monotonic ns), named by grantID; gen changes with every lease.
	tokens  int64
	expires int64
	grantID string
	gen     uint64
	timer   *time.Timer

	// A server denial is remembered until deniedUntil.
	deniedUntil int64

	// Decisions served locally and not yet counted in the metrics.
	served, deniedLocal int64

	// Demand: permits asked since rateStart, the smoothed rate (permits
	// per second), and the calls of the current hotness window.
	demand    int64
	rateStart int64
	rate      float64
	winStart  int64
	winCalls  int64

	refreshing bool          // a lease request is in flight
	refreshed  chan struct{} // closed when it returns
}

// leaseFast serves n permits of key from its lease, or answers a
// remembered server denial, without an RPC or an allocation. ok is false
// when the server must be asked.
func (l *Limiter) leaseFast(key string, n int64) (d Decision, ok bool) {
	ks := l.keys.get(key)
	if ks == nil {
		return Decision{}, false
	}
	now := l.c.now()
	ks.mu.Lock()
	ks.demand += n
	if ks.tokens >= n && now < ks.expires {
		ks.tokens -= n
		ks.served += n
		d = Decision{Allowed: true, Remaining: ks.tokens, Source: SourceLease}
		ks.mu.Unlock()
		return d, true
	}
	if now < ks.deniedUntil {
		ks.deniedLocal++
		d = Decision{RetryAfter: time.Duration(ks.deniedUntil - now), Source: SourceLease}
		ks.mu.Unlock()
		return d, true
	}
	ks.mu.Unlock()
	return Decision{}, false
}

// leasable reports whether the limiter leases for the rule.
func leasable(ri *ruleInfo) bool {
	if ri == nil || ri.leaseMax <= 0 {
		return false
	}
	switch ri.algorithm {
	case pb.Algorithm_TOKEN_BUCKET, pb.Algorithm_FIXED_WINDOW, pb.Algorithm_SLIDING_WINDOW:
		return true
	}
	return false
}

// leaseCaps are the largest batch and the longest lease for the rule:
// the smaller of the limiter's and the rule's, and never past the rule's
// period (the server takes refills only within it).
func (l *Limiter) leaseCaps(ri *ruleInfo) (maxBatch int64, ttl time.Duration) {
	maxBatch = ri.leaseMax
	if l.o.leaseMax > 0 {
		maxBatch = min(maxBatch, l.o.leaseMax)
	}
	ttl = ri.leaseTTL
	if l.o.leaseTTL > 0 && (ttl <= 0 || l.o.leaseTTL < ttl) {
		ttl = l.o.leaseTTL
	}
	if ri.period > 0 && (ttl <= 0 || ri.period < ttl) {
		ttl = ri.period
	}
	if ttl <= 0 {
		ttl = time.Second
	}
	return maxBatch, ttl
}

// batch sizes the next lease from the demand observed since the last one:
// rate × lease time, within [n, maxBatch] (at least 1).
func (ks *keyState) batch(now int64, ttl time.Duration, maxBatch, n int64) int64 {
	if elapsed := now - ks.rateStart; elapsed >= int64(time.Millisecond) {
		inst := float64(ks.demand) / (float64(elapsed) / 1e9)
		if ks.rate == 0 {
			ks.rate = inst
		} else {
			ks.rate = (ks.rate + inst) / 2
		}
		ks.demand, ks.rateStart = 0, now
	}
	want := int64(math.Ceil(ks.rate * ttl.Seconds()))
	return max(1, n, min(want, maxBatch))
}

// leaseSlow asks the server for a lease when key is hot and none is in
// flight, and serves this call from it. ok is false when the call should
// go to the server on its own (a cold key, a lease in flight, a grant
// smaller than n).
//
//nolint:revive // the bool after the error says whether the lease path decided at all
func (l *Limiter) leaseSlow(ctx context.Context, st *viewState, ri *ruleInfo, key string, n int64) (Decision, error, bool) {
	if !leasable(ri) {
		return Decision{}, nil, false
	}
	maxBatch, ttl := l.leaseCaps(ri)
	now := l.c.now()
	ks, created := l.keys.getOrCreate(key, now)
	if ks == nil {
		return Decision{}, nil, false
	}
	ks.mu.Lock()
	if created {
		ks.demand = n
	}
	if now-ks.winStart > int64(ttl) {
		ks.winStart, ks.winCalls = now, 0
	}
	ks.winCalls++
	if ks.refreshing && n <= maxBatch {
		// Wait (within the call timeout) for the lease being taken, rather
		// than sending a call of our own.
		ch := ks.refreshed
		ks.mu.Unlock()
		cctx, cancel := l.c.callContext(ctx)
		select {
		case <-ch:
		case <-cctx.Done():
		}
		cancel()
		if d, ok := l.leaseFast(key, n); ok {
			return d, nil, true
		}
		return Decision{}, nil, false
	}
	if ks.winCalls <= hotCalls || n > maxBatch {
		ks.mu.Unlock()
		return Decision{}, nil, false
	}
	ks.refreshing = true
	ks.refreshed = make(chan struct{})
	want := ks.batch(now, ttl, maxBatch, n)
	oldGrant, oldTokens := l.detach(ks, now)
	ks.mu.Unlock()
	if oldTokens > 0 {
		l.c.goTracked(func() { l.refill(key, oldGrant, oldTokens) })
	}

	resp, err := l.ask(ctx, st, key, &pb.AcquireTokenRequest{Rule: l.rule, Key: key, Permits: &want, Lease: true})
	now = l.c.now()
	ks.mu.Lock()
	ks.refreshing = false
	defer close(ks.refreshed) // after ks.mu is released below: waiters retry the fast path
	if err != nil {
		ks.mu.Unlock()
		d, err := l.onError(ctx, st, ri, key, n, err)
		return d, err, true
	}
	granted := resp.GetGranted()
	if !resp.GetAllowed() || granted <= 0 {
		ks.deniedUntil = now + resp.GetRetryAfterNs()
		ks.mu.Unlock()
		d := serverDecision(resp)
		l.count(d)
		return d, nil, true
	}
	l.m.granted.Add(float64(granted))
	life := ttl
	if ra := time.Duration(resp.GetResetAfterNs()); ra > 0 && ra < life {
		life = ra
	}
	ks.gen++
	gen := ks.gen
	ks.grantID, ks.tokens, ks.expires = resp.GetGrantId(), granted, now+int64(life)
	// End the lease a little early, so that the refill lands in time.
	ks.timer = time.AfterFunc(life-life/10, func() { l.expire(key, ks, gen) })
	if granted < n {
		ks.mu.Unlock()
		return Decision{}, nil, false
	}
	ks.tokens -= n
	ks.served += n
	d := Decision{Allowed: true, Remaining: ks.tokens, ResetAfter: time.Duration(resp.GetResetAfterNs()), Source: SourceLease}
	l.flush(ks)
	ks.mu.Unlock()
	return d, nil, true
}

// detach ends ks's current lease (ks.mu held): it returns the unused
// tokens to refill while the lease is live, and counts them expired
// otherwise.
func (l *Limiter) detach(ks *keyState, now int64) (grantID string, unused int64) {
	l.flush(ks)
	if ks.timer != nil {
		ks.timer.Stop()
		ks.timer = nil
	}
	ks.gen++
	if ks.tokens > 0 {
		if now < ks.expires {
			grantID, unused = ks.grantID, ks.tokens
		} else {
			l.m.expired.Add(float64(ks.tokens))
		}
	}
	ks.tokens, ks.grantID = 0, ""
	return grantID, unused
}

// flush moves ks's local counts into the metrics (ks.mu held).
func (l *Limiter) flush(ks *keyState) {
	if ks.served > 0 {
		l.m.leaseAllowed.Add(float64(ks.served))
		l.m.served.Add(float64(ks.served))
		ks.served = 0
	}
	if ks.deniedLocal > 0 {
		l.m.leaseDenied.Add(float64(ks.deniedLocal))
		ks.deniedLocal = 0
	}
}

// expire ends lease gen of key shortly before it expires and gives its
// unused tokens back.
func (l *Limiter) expire(key string, ks *keyState, gen uint64) {
	if !l.c.enter() {
		return
	}
	defer l.c.exit()
	ks.mu.Lock()
	if ks.gen != gen {
		ks.mu.Unlock()
		return
	}
	grant, unused := l.detach(ks, l.c.now())
	ks.mu.Unlock()
	if unused > 0 {
		l.refill(key, grant, unused)
	}
}

// refill gives unused tokens of a lease back to key's owner.
func (l *Limiter) refill(key, grantID string, unused int64) {
	ctx, cancel := context.WithTimeout(l.c.ctx, max(l.c.o.callTimeout, 100*time.Millisecond))
	defer cancel()
	l.refillCtx(ctx, key, grantID, unused)
}

func (l *Limiter) refillCtx(ctx context.Context, key, grantID string, unused int64) {
	var refilled int64
	if n, ctx := l.c.target(ctx, key); n != nil && !n.open.Load() {
		var resp *pb.RefillTokenResponse
		err := n.invoke(ctx, l.c.m.rpcRefill, maxRetries, func(ctx context.Context) (err error) {
			resp, err = n.tc.RefillToken(ctx, &pb.RefillTokenRequest{Rule: l.rule, Key: key, GrantId: grantID, Permits: &unused})
			return err
		})
		if err == nil {
			refilled = min(resp.GetRefilled(), unused)
		} else {
			l.c.log.Debug("tokenserver client: refill failed", "rule", l.rule, "err", err)
		}
	}
	l.m.refilled.Add(float64(refilled))
	l.m.expired.Add(float64(unused - refilled))
}

// rememberDenial makes key's calls denied locally for retryAfter after the
// server denied one.
func (l *Limiter) rememberDenial(key string, retryAfter time.Duration) {
	ks := l.keys.get(key)
	if ks == nil {
		return
	}
	until := l.c.now() + int64(retryAfter)
	ks.mu.Lock()
	ks.deniedUntil = max(ks.deniedUntil, until)
	ks.mu.Unlock()
}

// endLeases ends every lease of the limiter and gives unused tokens back
// (Close).
func (l *Limiter) endLeases(ctx context.Context) {
	if l.keys == nil {
		return
	}
	l.keys.each(func(key string, ks *keyState) {
		ks.mu.Lock()
		grant, unused := l.detach(ks, l.c.now())
		ks.mu.Unlock()
		if unused > 0 {
			l.refillCtx(ctx, key, grant, unused)
		}
	})
}
