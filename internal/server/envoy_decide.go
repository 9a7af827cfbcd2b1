package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/envoyrls"
	"github.com/tokenserver/tokenserver/internal/handoff"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
)

// envoyHitsHeader marks a ShouldRateLimit that one node forwards to the
// owner of some counters: its descriptors are counter hits, not Envoy's
// descriptors, and its answer's raw_body holds the decisions.
//
// Forwarding ShouldRateLimit itself, rather than adding an internal RPC,
// keeps the one method, role and peer connection that Envoy's calls use.
// The wire format of the hop (one descriptor per hit):
//
//	entries[0]   key: the counter key (Limit.CounterKey), value: "ALGORITHM/BURST"
//	limit        requests_per_unit and unit
//	hits_addend  the cost (0: read only)
//
// and the answer's raw_body is, per hit, the uvarints before, after,
// remaining and reset-after nanoseconds, then one byte: 1 when over.
const envoyHitsHeader = "x-tokenserver-envoy-hits"

// envoyDebitsHeader lists, comma-separated, the indexes of the hits of a
// forwarded batch that are debits (envoyrls.Hit.Debit). A header rather
// than a change of the descriptor format: a node that does not know it
// decides those hits as acquires, as it always did, instead of refusing
// the batch.
const envoyDebitsHeader = "x-tokenserver-envoy-debits"

// envoyMovedHeader marks a forwarded batch of hits that a node sent on
// because it had handed their counters over (shard.ErrMoved) to the
// owner the batch goes to. Such a batch that meets a handed-over counter
// again answers Unavailable rather than going round once more.
const envoyMovedHeader = "x-tokenserver-envoy-moved"

func isHitBatch(ctx context.Context) bool {
	return len(metadata.ValueFromIncomingContext(ctx, envoyHitsHeader)) > 0
}

// envoyDecider counts Envoy descriptors on the nodes that own them
// (cluster ownership of Limit.HashKey over the node's view, as
// AcquireTokens routes keys), in the node's bucket shards. Fixed windows,
// the default, count with Map.Hit on Unix time, so windows align to the
// epoch as the reference's; the algorithm extension decides with the
// ordinary Acquire.
type envoyDecider struct {
	n *Node
	// fixed holds one compiled rule per unit: a fixed-window counter is
	// shared by every limit of the same counter key and unit whatever its
	// requests_per_unit, as the reference's Redis key is; each limit judges
	// the count itself.
	fixed [8]*rule.Compiled
	// algos caches the compiled rules of the algorithm extension, by
	// algorithm, unit, limit and burst (a change starts new buckets).
	mu    sync.Mutex
	algos map[string]*rule.Compiled
}

// maxEnvoyAlgos bounds the algos cache: configurations are bounded, but a
// long-lived node sees many versions.
const maxEnvoyAlgos = 10000

func newEnvoyDecider(n *Node) *envoyDecider {
	d := &envoyDecider{n: n, algos: map[string]*rule.Compiled{}}
	for u := range envoyrls.Unit(len(d.fixed)) {
		if !envoyrls.ValidUnit(u) {
			continue
		}
		d.fixed[u] = rule.Compile(&rule.Rule{Name: "envoy/fixed-window/" + u.String(), Algorithm: bucket.FixedWindow,
			Limit: bucket.MaxLimit, Period: envoyrls.Period(u), Version: envoyVersion, Generation: 1})
	}
	if n != nil { // (a decider without a node only parses names)
		// Counters handed over to this node are installed under these
		// rules.
		n.buckets.SetLocalRules(d.byName)
	}
	return d
}

// isEnvoyRule selects the compiled rules of Envoy counters.
func isEnvoyRule(c *rule.Compiled) bool { return strings.HasPrefix(c.Rule.Name, "envoy/") }

// Decide implements envoyrls.Decider: hits of counters this node owns are
// decided here, the others are sent to their owners, one call per owner
// at once; an owner that cannot be reached has its hits decided by their
// next owners, as AcquireTokens fails over.
func (d *envoyDecider) Decide(ctx context.Context, _ time.Time, hits []envoyrls.Hit) ([]envoyrls.Decision, error) {
	out := make([]envoyrls.Decision, len(hits))
	now := time.Now().UnixNano() // one read for the hits decided here
	v := d.n.data.View()
	var remote, movedTo map[string][]int
	var owners, movedOwners map[string]cluster.Member
	d.n.observeView(v)
	var wait inFlightWait
	for i, h := range hits {
		owner, err := d.n.route(ctx, v, h.Limit.HashKey())
		if err != nil {
			return nil, err
		}
		if owner == nil {
			if l := h.Limit; d.n.handoff.Busy() && wait.held(ctx, d, d.ruleName(l.Unit, l.Algorithm, l.RequestsPerUnit, l.Burst), l.CounterKey(), l.HashKey()) {
				out[i] = heldDecision
				continue
			}
			var to cluster.Member
			var moved bool
			if out[i], to, moved, err = d.localHit(v, h, now); err != nil {
				return nil, err
			}
			if moved {
				if movedTo == nil {
					movedTo, movedOwners = map[string][]int{}, map[string]cluster.Member{}
				}
				movedTo[to.ID] = append(movedTo[to.ID], i)
				movedOwners[to.ID] = to
			}
			continue
		}
		if remote == nil {
			remote, owners = map[string][]int{}, map[string]cluster.Member{}
		}
		remote[owner.ID] = append(remote[owner.ID], i)
		owners[owner.ID] = *owner
	}
	var errs []error
	if remote != nil {
		errs = append(errs, d.forward(ctx, v, hits, owners, remote, out, true))
	}
	if movedTo != nil {
		errs = append(errs, d.forward(metadata.AppendToOutgoingContext(ctx, envoyMovedHeader, "1"), v, hits, movedOwners, movedTo, out, false))
	}
	return out, errors.Join(errs...)
}

// heldDecision answers a hit whose counter's state is still on its way
// to this node (inFlightWait): over the limit for a moment, as an acquire
// is denied with a short retry_after (handoffDecide). A deny is an
// answer; an error would let Envoy's failure mode admit the request.
var heldDecision = envoyrls.Decision{Over: true, ResetAfter: handoffRetryAfter}

// inFlightWait is the wait of one call's hits for counters whose state a
// handoff to this node still carries (Receiver.InFlightOwned), as an
// acquire's (handoffDecide): Envoy's hits have no question to send the
// old owner, which froze the counter when its view changed, so they wait
// for the batch carrying it, within two thirds of the call's time,
// shared by the call's hits. The old owner's handoff ending without the
// counter (it held none) ends the wait too: the counter starts here.
type inFlightWait struct {
	until time.Time
}

// held waits for the state of counter key of rule name (its owner
// hashed from ownerKey) while it is in flight, and reports whether it
// has still not come: the hit is then held (heldDecision).
func (w *inFlightWait) held(ctx context.Context, d *envoyDecider, name, key, ownerKey string) bool {
	r := d.n.handoff
	if _, ok := r.InFlightOwned(name, key, ownerKey); !ok {
		return false
	}
	if w.until.IsZero() {
		left := handoff.DefaultWait
		if dl, ok := ctx.Deadline(); ok {
			left = time.Until(dl)
		}
		w.until = time.Now().Add(2 * left / 3)
	}
	if r.WaitKeyOwned(ctx, name, key, ownerKey, w.until, false) {
		return false
	}
	r.Held.Add(1)
	return true
}

// localHit decides h here at now, unless this node handed its counter
// over (shard.ErrMoved): then moved is true and to is the key's owner in
// v, which decides it, as decideMoved sends an acquire on. When v gives
// the key back to this node, no newer state will come: the counter goes
// on from the state it left with (thawed) and is decided here.
func (d *envoyDecider) localHit(v *cluster.View, h envoyrls.Hit, now int64) (dec envoyrls.Decision, to cluster.Member, moved bool, err error) {
	l := h.Limit
	key := l.CounterKey()
	dec, err = d.local(l.Unit, key, l.Algorithm, l.RequestsPerUnit, l.Burst, h.Hits, h.Debit, now)
	if !errors.Is(err, shard.ErrMoved) {
		return dec, cluster.Member{}, false, err
	}
	if owner, ok := v.Owner(l.HashKey()); ok && owner.ID != d.n.data.ID() {
		return envoyrls.Decision{}, owner, true, nil
	}
	name := d.ruleName(l.Unit, l.Algorithm, l.RequestsPerUnit, l.Burst)
	if d.n.buckets.Thaw(name, key) {
		d.n.handoff.MarkStale(name, key)
	}
	dec, err = d.local(l.Unit, key, l.Algorithm, l.RequestsPerUnit, l.Burst, h.Hits, h.Debit, now)
	return dec, cluster.Member{}, false, err
}

// forward sends each owner its hits and writes the decisions into out.
func (d *envoyDecider) forward(ctx context.Context, v *cluster.View, hits []envoyrls.Hit, owners map[string]cluster.Member, remote map[string][]int, out []envoyrls.Decision, failover bool) error {
	var wg sync.WaitGroup
	errs := make([]error, 0, len(remote))
	var mu sync.Mutex
	for id, idx := range remote {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := owners[id]
			err := d.send(ctx, &owner, hits, idx, out)
			if err != nil && failover && unreachable(err) {
				err = d.failover(ctx, v, hits, id, idx, out, err)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// failover decides the hits idx of an owner that cannot be reached on
// their next owners: here, or forwarded once more (without failover).
func (d *envoyDecider) failover(ctx context.Context, v *cluster.View, hits []envoyrls.Hit, owner string, idx []int, out []envoyrls.Decision, cause error) error {
	var remote map[string][]int
	owners := map[string]cluster.Member{}
	now := time.Now().UnixNano()
	for _, i := range idx {
		h := hits[i]
		next, local, ok := d.n.nextOwner(ctx, v, h.Limit.HashKey(), owner, cause)
		if !ok {
			return failf(ErrUnavailable, "owner %s of envoy counters cannot be reached and no other member can take them", owner)
		}
		if local {
			var err error
			if out[i], err = d.local(h.Limit.Unit, h.Limit.CounterKey(), h.Limit.Algorithm, h.Limit.RequestsPerUnit, h.Limit.Burst, h.Hits, h.Debit, now); err != nil {
				return err
			}
			continue
		}
		if remote == nil {
			remote = map[string][]int{}
		}
		remote[next.ID] = append(remote[next.ID], i)
		owners[next.ID] = next
	}
	if remote == nil {
		return nil
	}
	return d.forward(avoiding(ctx, owner), v, hits, owners, remote, out, false) // the next owners check owner too
}

// send forwards the hits idx to owner and reads its decisions into out.
func (d *envoyDecider) send(ctx context.Context, owner *cluster.Member, hits []envoyrls.Hit, idx []int, out []envoyrls.Decision) error {
	req := &rlpb.RateLimitRequest{Domain: hits[idx[0]].Limit.Domain, Descriptors: make([]*ratelimitv3.RateLimitDescriptor, len(idx))}
	var debits []string
	for j, i := range idx {
		l := hits[i].Limit
		if hits[i].Debit {
			debits = append(debits, strconv.Itoa(j))
		}
		req.Descriptors[j] = &ratelimitv3.RateLimitDescriptor{
			Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: l.CounterKey(), Value: strconv.Itoa(int(l.Algorithm)) + "/" + strconv.FormatInt(l.Burst, 10)}},
			Limit:      &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: l.RequestsPerUnit, Unit: typev3.RateLimitUnit(l.Unit)},
			HitsAddend: wrapperspb.UInt64(hits[i].Hits),
		}
	}
	conn, err := d.n.peers.conn(owner.GRPCAddr)
	if err != nil {
		return peerError("owner "+owner.ID, err)
	}
	d.n.metrics.forwarded.WithLabelValues(owner.ID).Inc()
	fctx := metadata.AppendToOutgoingContext(markForwarded(ctx), envoyHitsHeader, "1")
	if debits != nil {
		fctx = metadata.AppendToOutgoingContext(fctx, envoyDebitsHeader, strings.Join(debits, ","))
	}
	resp, err := rlpb.NewRateLimitServiceClient(conn).ShouldRateLimit(fctx, req)
	if err != nil {
		return peerError("owner "+owner.ID, err)
	}
	ds, err := decodeDecisions(resp.GetRawBody(), len(idx))
	if err != nil {
		return failf(ErrInternal, "owner %s: %v", owner.ID, err)
	}
	for j, i := range idx {
		out[i] = ds[j]
	}
	return nil
}

// serveHits decides a forwarded batch of hits here.
func (d *envoyDecider) serveHits(ctx context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
	debit := make([]bool, len(req.GetDescriptors()))
	for _, v := range metadata.ValueFromIncomingContext(ctx, envoyDebitsHeader) {
		for _, f := range strings.Split(v, ",") {
			i, err := strconv.Atoi(f)
			if err != nil || i < 0 || i >= len(debit) {
				return nil, failf(ErrBadRequest, "forwarded envoy debits %q: not an index of the %d hits", v, len(debit))
			}
			debit[i] = true
		}
	}
	ds := req.GetDescriptors()
	out := make([]envoyrls.Decision, len(ds))
	now := time.Now().UnixNano()
	var v *cluster.View
	var movedTo map[string][]int
	var movedOwners map[string]cluster.Member
	var movedHits []envoyrls.Hit
	d.n.observeView(d.n.data.View())
	var wait inFlightWait
	for i, desc := range ds {
		es, l := desc.GetEntries(), desc.GetLimit()
		if len(es) != 1 || l == nil || !envoyrls.ValidUnit(envoyrls.Unit(l.GetUnit())) {
			return nil, failf(ErrBadRequest, "forwarded envoy hit %d is malformed", i)
		}
		a, b, ok := strings.Cut(es[0].GetValue(), "/")
		alg, err1 := strconv.Atoi(a)
		burst, err2 := strconv.ParseInt(b, 10, 64)
		if !ok || err1 != nil || err2 != nil || alg <= 0 || alg > 255 {
			return nil, failf(ErrBadRequest, "forwarded envoy hit %d: bad algorithm/burst %q", i, es[0].GetValue())
		}
		unit := envoyrls.Unit(l.GetUnit())
		if d.n.handoff.Busy() {
			if hashKey, ok := envoyrls.HashKeyOf(es[0].GetKey(), unit, bucket.Algorithm(alg)); ok &&
				wait.held(ctx, d, d.ruleName(unit, bucket.Algorithm(alg), l.GetRequestsPerUnit(), burst), es[0].GetKey(), hashKey) {
				out[i] = heldDecision
				continue
			}
		}
		dec, err := d.local(unit, es[0].GetKey(), bucket.Algorithm(alg), l.GetRequestsPerUnit(), burst, desc.GetHitsAddend().GetValue(), debit[i], now)
		if errors.Is(err, shard.ErrMoved) && len(metadata.ValueFromIncomingContext(ctx, envoyMovedHeader)) == 0 {
			// Handed over: sent on to the key's owner (localHit), once.
			hashKey, ok := envoyrls.HashKeyOf(es[0].GetKey(), unit, bucket.Algorithm(alg))
			if !ok {
				return nil, failf(ErrBadRequest, "forwarded envoy hit %d: counter key %q does not end with its unit and algorithm", i, es[0].GetKey())
			}
			if v == nil {
				v = d.n.data.View()
			}
			h := envoyrls.Hit{Limit: &envoyrls.Limit{Domain: req.GetDomain(), Key: hashKey, Unit: unit, RequestsPerUnit: l.GetRequestsPerUnit(),
				Algorithm: bucket.Algorithm(alg), Burst: burst}, Hits: desc.GetHitsAddend().GetValue(), Debit: debit[i]}
			var to cluster.Member
			var moved bool
			if dec, to, moved, err = d.localHit(v, h, now); err == nil && moved {
				if movedTo == nil {
					movedTo, movedOwners, movedHits = map[string][]int{}, map[string]cluster.Member{}, make([]envoyrls.Hit, len(ds))
				}
				movedHits[i] = h
				movedTo[to.ID] = append(movedTo[to.ID], i)
				movedOwners[to.ID] = to
			}
		}
		if err != nil {
			return nil, err
		}
		out[i] = dec
	}
	if movedTo != nil {
		fctx := metadata.AppendToOutgoingContext(ctx, envoyMovedHeader, "1")
		if err := d.forward(fctx, v, movedHits, movedOwners, movedTo, out, false); err != nil {
			return nil, err
		}
	}
	body := make([]byte, 0, 16*len(ds))
	for _, dec := range out {
		body = appendDecision(body, dec)
	}
	return &rlpb.RateLimitResponse{OverallCode: rlpb.RateLimitResponse_OK, RawBody: body}, nil
}

// local decides one hit on this node's shards at now, Unix nanoseconds
// (the hits of one call share one read of the clock). A debit (see
// envoyrls.Hit.Debit) of the algorithm extension is charged with
// Map.Debit, as a commit without a reservation.
func (d *envoyDecider) local(unit envoyrls.Unit, key string, alg bucket.Algorithm, rpu uint32, burst int64, hits uint64, debit bool, now int64) (envoyrls.Decision, error) {
	n := int64(min(hits, bucket.MaxLimit))
	if alg == bucket.FixedWindow || alg == bucket.Unspecified {
		r, err := d.n.buckets.Hit(d.fixed[unit], key, n, now)
		if err != nil {
			return envoyrls.Decision{}, fmt.Errorf("envoy counter: %w", err)
		}
		dec := envoyrls.Decision{Before: uint64(r.Before), After: uint64(r.After)}
		if dec.After > uint64(rpu) {
			dec.Over = true
		} else {
			dec.Remaining = uint32(uint64(rpu) - dec.After)
		}
		return dec, nil
	}
	if rpu == 0 {
		return envoyrls.Decision{Over: true, After: uint64(n)}, nil
	}
	c := d.compiled(unit, alg, rpu, burst)
	if debit && bucket.OffersCommit(alg) {
		return d.debit(c, key, n, now)
	}
	res, err := d.n.buckets.Acquire(c, key, bucket.Request{Permits: n}, now)
	if errors.Is(err, rule.ErrInvalid) {
		// More than the bucket could ever grant: over, as the reference
		// answers a cost above the limit.
		return envoyrls.Decision{Over: true, After: uint64(n)}, nil
	}
	if err != nil {
		return envoyrls.Decision{}, fmt.Errorf("envoy counter: %w", err)
	}
	capacity := c.Config.Capacity()
	used := max(0, capacity-res.Remaining)
	dec := envoyrls.Decision{Over: !res.Allowed, ResetAfter: time.Duration(max(res.ResetAfter, res.RetryAfter))}
	if res.Allowed {
		dec.Remaining = clampU32(res.Remaining)
		dec.After, dec.Before = uint64(used), uint64(max(0, used-n))
	} else {
		dec.Before, dec.After = uint64(used), uint64(used+n)
	}
	return dec, nil
}

// debit charges a reported cost of n on the algorithm-extension bucket c
// of key: always, even past the limit. The hit is over when the bucket
// is left owing (the charge did not fit in what it held).
func (d *envoyDecider) debit(c *rule.Compiled, key string, n, now int64) (envoyrls.Decision, error) {
	r, err := d.n.buckets.Debit(c, key, n, now)
	if err != nil {
		return envoyrls.Decision{}, fmt.Errorf("envoy counter: %w", err)
	}
	capacity := c.Config.Capacity()
	after := uint64(capacity-r.Remaining) + uint64(r.Debt)
	dec := envoyrls.Decision{Before: after - uint64(n), After: after, Over: r.Debt > 0, ResetAfter: time.Duration(r.RetryAfter)}
	if !dec.Over {
		dec.Remaining = clampU32(r.Remaining)
	}
	return dec, nil
}

// ruleName is the name of the rule that holds the counters of a limit.
func (d *envoyDecider) ruleName(unit envoyrls.Unit, alg bucket.Algorithm, rpu uint32, burst int64) string {
	if alg == bucket.FixedWindow || alg == bucket.Unspecified {
		return d.fixed[unit].Rule.Name
	}
	return "envoy/" + alg.String() + "/" + unit.String() + "/" + strconv.FormatUint(uint64(rpu), 10) + "/" + strconv.FormatInt(burst, 10)
}

// envoyOwnerKey is, for the bucket key of an Envoy counter (its rule's
// name starts with "envoy/", as ruleName makes it), the key whose owner
// holds it (Limit.HashKey): the counter key without its unit and
// algorithm. ok is false for any other rule. The handoff moves an Envoy
// counter to the node that decides it, which routes by that key.
func envoyOwnerKey(ruleName, key string) (string, bool) {
	alg, unit, _, ok := parseEnvoyRuleName(ruleName)
	if !ok {
		return "", false
	}
	return envoyrls.HashKeyOf(key, unit, alg)
}

// parseEnvoyRuleName splits the name of an Envoy counter's rule (as
// ruleName makes it) into its algorithm, its unit and, for the algorithm
// extension, its requests per unit and burst, still as text (nil for a
// fixed window). ok is false for any other name.
func parseEnvoyRuleName(name string) (alg bucket.Algorithm, unit envoyrls.Unit, limit []string, ok bool) {
	rest, ok := strings.CutPrefix(name, "envoy/")
	if !ok {
		return 0, 0, nil, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 2 && len(parts) != 4 {
		return 0, 0, nil, false
	}
	alg, err := bucket.ParseAlgorithm(parts[0])
	u, known := rlpb.RateLimitResponse_RateLimit_Unit_value[parts[1]]
	if err != nil || !known || (len(parts) == 2) != (alg == bucket.FixedWindow) {
		return 0, 0, nil, false
	}
	return alg, envoyrls.Unit(u), parts[2:], true
}

// byName is the compiled rule of the Envoy counters' rule named name, as
// the decisions here use it, or nil when name is not one (or names a
// limit no configuration could give): the node's shard.LocalRules, so
// that Envoy counters handed over by their old owner (internal/handoff)
// are installed here, their rules being in no rule table.
func (d *envoyDecider) byName(name string) *rule.Compiled {
	alg, unit, limit, ok := parseEnvoyRuleName(name)
	if !ok || !envoyrls.ValidUnit(unit) || int(unit) >= len(d.fixed) {
		return nil
	}
	if alg == bucket.FixedWindow {
		return d.fixed[unit]
	}
	rpu, err1 := strconv.ParseUint(limit[0], 10, 32)
	burst, err2 := strconv.ParseInt(limit[1], 10, 64)
	if err1 != nil || err2 != nil || d.ruleName(unit, alg, uint32(rpu), burst) != name {
		return nil // not in the form ruleName gives: no counter of ours
	}
	r := &rule.Rule{Name: name, Algorithm: alg, Limit: int64(rpu), Period: envoyrls.Period(unit), Burst: burst, Version: envoyVersion, Generation: 1}
	r.Normalize()
	if r.Validate() != nil {
		return nil
	}
	return d.compiled(unit, alg, uint32(rpu), burst)
}

// compiled returns the rule of an algorithm-extension limit.
func (d *envoyDecider) compiled(unit envoyrls.Unit, alg bucket.Algorithm, rpu uint32, burst int64) *rule.Compiled {
	name := d.ruleName(unit, alg, rpu, burst)
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.algos[name]; c != nil {
		return c
	}
	r := &rule.Rule{Name: name, Algorithm: alg, Limit: int64(rpu), Period: envoyrls.Period(unit), Burst: burst, Version: envoyVersion, Generation: 1}
	r.Normalize()
	c := rule.Compile(r)
	if len(d.algos) < maxEnvoyAlgos {
		d.algos[name] = c
	}
	return c
}

func appendDecision(b []byte, d envoyrls.Decision) []byte {
	b = binary.AppendUvarint(b, d.Before)
	b = binary.AppendUvarint(b, d.After)
	b = binary.AppendUvarint(b, uint64(d.Remaining))
	b = binary.AppendUvarint(b, uint64(max(0, d.ResetAfter)))
	if d.Over {
		return append(b, 1)
	}
	return append(b, 0)
}

func decodeDecisions(b []byte, n int) ([]envoyrls.Decision, error) {
	out := make([]envoyrls.Decision, n)
	for i := range out {
		var vals [4]uint64
		for k := range vals {
			v, w := binary.Uvarint(b)
			if w <= 0 {
				return nil, fmt.Errorf("envoy hit answer %d of %d is truncated", i, n)
			}
			vals[k], b = v, b[w:]
		}
		if len(b) == 0 {
			return nil, fmt.Errorf("envoy hit answer %d of %d is truncated", i, n)
		}
		out[i] = envoyrls.Decision{Before: vals[0], After: vals[1], Remaining: uint32(min(vals[2], 1<<32-1)), ResetAfter: time.Duration(min(vals[3], 1<<63-1)), Over: b[0] == 1}
		b = b[1:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("envoy hit answers: %d bytes left over", len(b))
	}
	return out, nil
}
