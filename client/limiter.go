package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/backoff"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Source says who made a decision.
type Source uint8

// The sources of a decision.
const (
	// SourceServer: the key's owner answered.
	SourceServer Source = iota
	// SourceLease: served locally from tokens the server leased to this
	// client (or a denial the server gave, remembered until its
	// retry-after).
	SourceLease
	// SourceFallback: the server could not answer; the fallback policy
	// decided.
	SourceFallback
)

// String returns "server", "lease" or "fallback".
func (s Source) String() string {
	switch s {
	case SourceServer:
		return "server"
	case SourceLease:
		return "lease"
	case SourceFallback:
		return "fallback"
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

// Decision is the answer to one AllowN.
type Decision struct {
	// Allowed reports whether the permits were granted.
	Allowed bool
	// Remaining is how many permits are left: in the server's bucket, in
	// the local lease, or in the local fallback limiter, by Source.
	Remaining int64
	// RetryAfter, when denied, is how long to wait before trying again.
	RetryAfter time.Duration
	// ResetAfter is how long until the key is back at its full limit (from
	// the server; 0 otherwise).
	ResetAfter time.Duration
	// WaitBefore is, for a shaped grant (Wait), how long the caller must
	// wait before doing the work.
	WaitBefore time.Duration
	// Source says who decided.
	Source Source
}

// FromFallback reports whether the decision was made locally because the
// server could not answer.
func (d Decision) FromFallback() bool { return d.Source == SourceFallback }

// Limiter decides for one rule. Get it from Client.Limiter and reuse it; it
// is safe for simultaneous use by multiple goroutines. Allow is the method
// most callers want.
type Limiter struct {
	c    *Client
	rule string
	o    limiterOptions
	m    *ruleMetrics
	keys *keyMap // lease states; nil unless the limiter leases

	warnedUnknown atomic.Bool // the server said the rule does not exist, logged
}

// Limiter returns the client's Limiter for the named rule, creating it with
// opts on first use. Later calls for the same rule return the same
// Limiter: with equal options that is all; with options that differ, the
// first call's stay in force, and the conflict is logged at warn and
// counted in tokenserver_client_limiter_option_conflicts_total (never a
// panic: a second library taking the same rule must not crash the
// process). Use LimiterE to get ErrLimiterOptions instead.
func (c *Client) Limiter(ruleName string, opts ...LimiterOption) *Limiter {
	l, err := c.LimiterE(ruleName, opts...)
	if err != nil {
		c.m.limiterConflicts.WithLabelValues(ruleName).Inc()
		c.log.Warn("tokenserver client: Limiter called again with other options; the first call's options stay in force",
			"rule", ruleName, "first", l.o.String(), "ignored", optionsOf(opts).String())
	}
	return l
}

// LimiterE is Limiter that reports a conflict: for a rule that already has
// a Limiter created with other options it returns that Limiter (its
// options unchanged) and an error wrapping ErrLimiterOptions.
func (c *Client) LimiterE(ruleName string, opts ...LimiterOption) (*Limiter, error) {
	o := optionsOf(opts)
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.limiters[ruleName]; l != nil {
		if l.o != o {
			return l, fmt.Errorf("rule %q: first %s, now %s: %w", ruleName, l.o.String(), o.String(), ErrLimiterOptions)
		}
		return l, nil
	}
	l := &Limiter{c: c, rule: ruleName, m: c.m.forRule(ruleName), o: o}
	if l.o.leasing {
		l.keys = newKeyMap(DefaultMaxLeaseKeys)
	}
	c.limiters[ruleName] = l
	return l, nil
}

// optionsOf applies opts to zero options.
func optionsOf(opts []LimiterOption) limiterOptions {
	var o limiterOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Rule returns the name of the limiter's rule.
func (l *Limiter) Rule() string { return l.rule }

// Allow reports whether one permit of key may be used now. It never
// blocks longer than the call timeout (or ctx's earlier deadline). When the
// server cannot answer, the fallback policy decides; an invalid key is
// denied; an unknown rule is decided by the fallback policy.
func (l *Limiter) Allow(ctx context.Context, key string) bool {
	d, _ := l.decide(ctx, key, 1, 0)
	return d.Allowed
}

// AllowN asks for n permits of key (all or nothing; 0 peeks). A denial is
// not an error: it is Decision.Allowed == false with a RetryAfter. The
// error is ErrUnavailable when the server could not answer and the
// fallback policy denies, ErrInvalid for a bad request, ErrNotFound for an
// unknown rule (the decision then comes from the fallback policy), and
// ErrClosed after Close (likewise); canceling ctx returns its error.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (Decision, error) {
	return l.decide(ctx, key, n, 0)
}

// decide is AllowN with a max_wait for shaping.
func (l *Limiter) decide(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error) {
	if n < 0 {
		return Decision{}, fmt.Errorf("rule %q: permits must be >= 0, got %d: %w", l.rule, n, ErrInvalid)
	}
	if l.keys != nil && n > 0 {
		if d, ok := l.leaseFast(key, n); ok {
			return d, nil
		}
	}
	return l.decideSlow(ctx, key, n, maxWait)
}

// decideSlow is decide past the lease fast path; kept apart so that the
// fast path allocates nothing.
func (l *Limiter) decideSlow(ctx context.Context, key string, permits int64, maxWait time.Duration) (Decision, error) {
	n := permits
	if err := rule.ValidKey(key); err != nil {
		return Decision{}, fmt.Errorf("rule %q: %w: %w", l.rule, err, ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	st := l.c.state.Load()
	ri := st.rules[l.rule]
	if l.c.isClosed() {
		return l.fallback(st, ri, key, n, ErrClosed)
	}
	if l.keys != nil && n > 0 && maxWait == 0 {
		if d, err, ok := l.leaseSlow(ctx, st, ri, key, n); ok {
			return d, err
		}
	}
	resp, err := l.ask(ctx, st, key, &pb.AcquireTokenRequest{Rule: l.rule, Key: key, Permits: &n, MaxWaitNs: int64(maxWait)})
	if err != nil {
		return l.onError(ctx, st, ri, key, n, err)
	}
	d := serverDecision(resp)
	l.count(d)
	if l.keys != nil && !d.Allowed && n > 0 {
		l.rememberDenial(key, d.RetryAfter)
	}
	return d, nil
}

// ask sends one acquire for key within the call's deadline: to its owner,
// or, while the owner's breaker is open, to its next owner (see pick).
// A node that was reached and decided nothing (not ready, no view yet), or
// that provably never got the call (connection refused), does not end the
// call: it goes to the next candidate, or to the same node again after a
// short backoff, while the deadline leaves room; only then does the error
// return (and the fallback policy decide).
func (l *Limiter) ask(ctx context.Context, st *viewState, key string, req *pb.AcquireTokenRequest) (*pb.AcquireTokenResponse, error) {
	cctx, cancel := l.c.callContext(ctx)
	defer cancel()
	var skip []*node
	var bo *backoff.Backoff // only a pause needs one
	for {
		n, avoid := l.c.pick(st, key, skip)
		if n == nil {
			return nil, status.Error(codes.Unavailable, "no cluster view yet")
		}
		resp, err := n.acquire(cctx, req, avoid)
		if err == nil || isAuthError(err) || !(isNotReady(err) || notSent(err)) || l.c.isClosed() {
			return resp, err
		}
		if !slices.Contains(skip, n) {
			skip = append(skip, n) // try the next candidate at once
		} else {
			if bo == nil {
				bo = backoff.New(backoff.Policy{Base: time.Millisecond, Max: 16 * time.Millisecond})
			}
			if !bo.Sleep(cctx, time.Millisecond) {
				return nil, err
			}
		}
		st = l.c.state.Load() // a view may have come meanwhile
	}
}

// callContext bounds ctx by the call timeout.
func (c *Client) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= c.o.callTimeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.o.callTimeout)
}

func (c *Client) isClosed() bool { return c.closing.Load() }

func serverDecision(resp *pb.AcquireTokenResponse) Decision {
	return Decision{
		Allowed:    resp.GetAllowed(),
		Remaining:  resp.GetRemaining(),
		RetryAfter: time.Duration(resp.GetRetryAfterNs()),
		ResetAfter: time.Duration(resp.GetResetAfterNs()),
		WaitBefore: time.Duration(resp.GetWaitBeforeNs()),
		Source:     SourceServer,
	}
}

// count records a decision in the metrics.
func (l *Limiter) count(d Decision) {
	switch {
	case d.Source == SourceServer && d.Allowed:
		l.m.serverAllowed.Inc()
	case d.Source == SourceServer:
		l.m.serverDenied.Inc()
	case d.Source == SourceLease && d.Allowed:
		l.m.leaseAllowed.Inc()
	case d.Source == SourceLease:
		l.m.leaseDenied.Inc()
	case d.Allowed:
		l.m.fallbackAllowed.Inc()
	default:
		l.m.fallbackDenied.Inc()
	}
}

// onError turns an RPC error into the caller's answer: the server's
// refusals become errors, failures to answer become fallback decisions. A
// refusal of the credentials is an *AuthError and a denial, never a
// fallback. A rule the server does not know is decided by the Limiter's
// WithFallback option, else allowed, counted, and logged once. The node's
// bucket cap (ResourceExhausted) is decided by the fallback policy, but
// denied when no policy is known.
func (l *Limiter) onError(ctx context.Context, st *viewState, ri *ruleInfo, key string, n int64, err error) (Decision, error) {
	if isAuthError(err) {
		l.c.authRefused(err)
		return Decision{RetryAfter: l.c.o.callTimeout}, fmt.Errorf("rule %q: %w", l.rule, &AuthError{Err: err})
	}
	switch status.Code(err) {
	case codes.ResourceExhausted:
		return l.fallbackStrict(st, ri, key, n, err)
	case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition:
		return Decision{}, fmt.Errorf("rule %q key %q: %s: %w", l.rule, key, l.serverMessage(err), ErrInvalid)
	case codes.NotFound:
		l.c.m.unknownRule.WithLabelValues(l.rule).Inc()
		if l.warnedUnknown.CompareAndSwap(false, true) {
			p, _, _, byDefault := l.policy(nil)
			l.c.log.Warn("tokenserver client: the server has no such rule; its calls are decided by the limiter's fallback policy",
				"rule", l.rule, "policy", p.String(), "by_default", byDefault)
		}
		d, ferr := l.fallback(st, nil, key, n, err)
		if !errors.Is(ferr, ErrClosed) {
			ferr = fmt.Errorf("rule %q: the server has no such rule (the limiter's fallback policy decided): %w", l.rule, ErrNotFound)
		}
		return d, ferr
	}
	if ctx.Err() == context.Canceled {
		return Decision{}, ctx.Err()
	}
	return l.fallback(st, ri, key, n, err)
}

// serverMessage is err's message without a leading `rule "name": `, so
// that errors name the rule once.
func (l *Limiter) serverMessage(err error) string {
	msg := status.Convert(err).Message()
	return strings.TrimPrefix(msg, fmt.Sprintf("rule %q: ", l.rule))
}

// policy resolves the fallback policy: the rule's from the view, else the
// limiter's option, else allow (default true). It returns the LOCAL limit
// and period too.
func (l *Limiter) policy(ri *ruleInfo) (p FallbackPolicy, limit int64, period time.Duration, byDefault bool) {
	period = time.Second
	if ri != nil && ri.period > 0 {
		period = ri.period
	}
	if ri != nil && ri.fbPolicy != FallbackUnspecified {
		return ri.fbPolicy, ri.fbLimit, period, false
	}
	if l.o.fbPolicy != FallbackUnspecified {
		return l.o.fbPolicy, l.o.fbLimit, period, false
	}
	return FallbackAllow, 0, period, true
}

// fallbackStrict decides locally because the server refused the call for
// lack of room (its bucket cap, ResourceExhausted): by the fallback policy
// when one is known, else denied. The server answered, so "allow while the
// server is unreachable" does not apply: one client flooding new keys must
// not switch limiting off for every new key.
func (l *Limiter) fallbackStrict(st *viewState, ri *ruleInfo, key string, n int64, cause error) (Decision, error) {
	if _, _, _, byDefault := l.policy(ri); byDefault {
		d := Decision{Source: SourceFallback, RetryAfter: l.c.o.callTimeout}
		l.count(d)
		return d, fmt.Errorf("rule %q: the server is out of room for new keys (%v) and no fallback policy is known: denied: %w", l.rule, causeText(cause), ErrUnavailable)
	}
	return l.fallback(st, ri, key, n, cause)
}

// fallback decides locally because of cause.
func (l *Limiter) fallback(st *viewState, ri *ruleInfo, key string, n int64, cause error) (Decision, error) {
	p, limit, period, byDefault := l.policy(ri)
	d := Decision{Source: SourceFallback}
	var err error
	switch {
	case p == FallbackDeny || (p == FallbackLocal && limit <= 0):
		d.RetryAfter = l.c.o.callTimeout
		err = fmt.Errorf("rule %q: server unavailable (%v) and the fallback policy denies: %w", l.rule, causeText(cause), ErrUnavailable)
	case p == FallbackLocal:
		d.Allowed, d.RetryAfter, d.Remaining = l.c.fb.allow(l.rule, key, n, limit, period, time.Now())
	default:
		d.Allowed = true
		if byDefault {
			l.c.m.defaultAllow.Inc()
		}
	}
	l.count(d)
	if errors.Is(cause, ErrClosed) && err == nil {
		err = ErrClosed
	}
	return d, err
}

func causeText(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Code().String() + ": " + st.Message()
	}
	return err.Error()
}

// Wait blocks until one permit of key is granted or ctx ends; see WaitN.
func (l *Limiter) Wait(ctx context.Context, key string) error { return l.WaitN(ctx, key, 1) }

// WaitN blocks until n permits of key are granted or ctx ends, like
// Guava's acquire: it sends the time left (capped at the rule's period) as
// max_wait, so that a shaping rule reserves future tokens, sleeps the
// grant's wait_before, and after a denial retries after its retry-after
// while ctx allows. It returns nil once granted; a *DeniedError (ErrDenied)
// at once when the wait would outlast ctx's deadline; ctx's error when it
// ends; ErrUnavailable when the server cannot answer and the fallback
// policy denies; ErrInvalid, ErrNotFound as AllowN.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		left := time.Duration(1<<63 - 1)
		if dl, ok := ctx.Deadline(); ok {
			left = time.Until(dl)
		}
		st := l.c.state.Load()
		ri := st.rules[l.rule]
		var maxWait time.Duration
		if ri != nil && ri.period > 0 && (ri.algorithm == pb.Algorithm_TOKEN_BUCKET || ri.algorithm == pb.Algorithm_LEAKY_BUCKET) {
			maxWait = max(0, min(left-min(l.c.o.callTimeout, left/4), ri.period))
		}
		d, err := l.decide(ctx, key, n, maxWait)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		if d.FromFallback() && !d.Allowed && err == nil {
			// Reserve on the local limiter instead of polling it.
			p, limit, period, _ := l.policy(ri)
			if p == FallbackLocal {
				ok, wait := l.c.fb.reserve(l.rule, key, n, limit, period, time.Now(), left)
				if !ok {
					return &DeniedError{RetryAfter: wait, Reason: "local fallback limit; the wait would outlast the context"}
				}
				d.Allowed, d.WaitBefore = true, wait
			}
		}
		if d.Allowed {
			if d.WaitBefore > 0 {
				if err := sleep(ctx, d.WaitBefore); err != nil {
					return err
				}
			}
			return nil
		}
		wait := max(d.RetryAfter, time.Millisecond)
		if wait > left {
			return &DeniedError{RetryAfter: d.RetryAfter, Reason: "the wait would outlast the context"}
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
