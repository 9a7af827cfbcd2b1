package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Handle is a held concurrency lease from Acquire. While held, it renews
// the lease in the background at about a third of its lifetime; Release
// ends it. It is safe for simultaneous use by multiple goroutines.
type Handle struct {
	l      *Limiter
	key    string
	grant  string        // empty for a handle decided locally
	local  *localLimiter // the local slot, for a LOCAL fallback handle
	period time.Duration

	mu       sync.Mutex
	released bool
	lost     bool
	timer    *time.Timer
}

// Acquire takes one concurrency lease of key (for CONCURRENCY rules) and
// returns its handle; call Release when the work is done. A full key is a
// *DeniedError (ErrDenied). When the server cannot answer, the fallback
// policy decides: ALLOW returns a handle that holds nothing on the server,
// LOCAL holds one of fallback.limit local slots per key, DENY returns
// ErrUnavailable.
func (l *Limiter) Acquire(ctx context.Context, key string) (*Handle, error) {
	if err := rule.ValidKey(key); err != nil {
		return nil, fmt.Errorf("rule %q: %w: %w", l.rule, err, ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st := l.c.state.Load()
	ri := st.rules[l.rule]
	if ri != nil && ri.algorithm != pb.Algorithm_CONCURRENCY {
		return nil, fmt.Errorf("rule %q is %v, not CONCURRENCY: %w", l.rule, ri.algorithm, ErrInvalid)
	}
	var err error
	if l.c.isClosed() {
		err = ErrClosed
	} else {
		one := int64(1)
		var resp *pb.AcquireTokenResponse
		resp, err = l.ask(ctx, st, key, &pb.AcquireTokenRequest{Rule: l.rule, Key: key, Permits: &one})
		if err == nil {
			d := serverDecision(resp)
			l.count(d)
			if !d.Allowed {
				return nil, &DeniedError{RetryAfter: d.RetryAfter, Reason: "concurrency limit reached"}
			}
			period := time.Duration(resp.GetResetAfterNs())
			if ri != nil && ri.period > 0 {
				period = ri.period
			}
			return l.c.hold(&Handle{l: l, key: key, grant: resp.GetGrantId(), period: period}), nil
		}
		if isAuthError(err) {
			_, err = l.onError(ctx, st, ri, key, 1, err)
			return nil, err
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition:
			_, err = l.onError(ctx, st, ri, key, 1, err)
			return nil, err
		}
		if ctx.Err() == context.Canceled {
			return nil, ctx.Err()
		}
	}
	// Fallback.
	p, limit, period, byDefault := l.policy(ri)
	if byDefault && status.Code(err) == codes.ResourceExhausted {
		// The server answered that it is out of room: no policy known,
		// no allow (see Limiter.fallbackStrict).
		p = FallbackDeny
	}
	switch {
	case p == FallbackDeny || (p == FallbackLocal && limit <= 0):
		l.count(Decision{Source: SourceFallback})
		return nil, fmt.Errorf("rule %q: server unavailable (%v) and the fallback policy denies: %w", l.rule, causeText(err), ErrUnavailable)
	case p == FallbackLocal:
		ll, ok := l.c.fb.hold(l.rule, key, limit, period)
		if !ok {
			l.count(Decision{Source: SourceFallback})
			return nil, &DeniedError{RetryAfter: l.c.o.callTimeout, Reason: "local fallback concurrency limit reached"}
		}
		l.count(Decision{Allowed: true, Source: SourceFallback})
		return &Handle{l: l, key: key, local: ll}, nil
	default:
		if byDefault {
			l.c.m.defaultAllow.Inc()
		}
		l.count(Decision{Allowed: true, Source: SourceFallback})
		return &Handle{l: l, key: key}, nil
	}
}

// hold tracks a server handle and starts its renewals.
func (c *Client) hold(h *Handle) *Handle {
	c.mu.Lock()
	c.handles[h] = struct{}{}
	c.mu.Unlock()
	h.mu.Lock()
	h.schedule()
	h.mu.Unlock()
	return h
}

// schedule arms the next renewal (h.mu held).
func (h *Handle) schedule() {
	if h.period <= 0 || h.released || h.lost {
		return
	}
	h.timer = time.AfterFunc(h.period/3, h.renew)
}

// renew extends the lease once and schedules the next renewal.
func (h *Handle) renew() {
	c := h.l.c
	if !c.enter() {
		return
	}
	defer c.exit()
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	timeout := min(max(c.o.callTimeout, 100*time.Millisecond), max(h.period/3, c.o.callTimeout))
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	defer cancel()
	renewed, err := true, error(nil)
	if n, ctx := c.target(ctx, h.key); n != nil && !n.open.Load() {
		var resp *pb.RenewLeaseResponse
		err = n.invoke(ctx, c.m.rpcRenew, maxRetries, func(ctx context.Context) (err error) {
			resp, err = n.tc.RenewLease(ctx, &pb.RenewLeaseRequest{Rule: h.l.rule, Key: h.key, GrantId: h.grant})
			return err
		})
		if err == nil {
			renewed = resp.GetRenewed()
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !renewed {
		h.lost = true
		c.log.Warn("tokenserver client: concurrency lease lost (expired or the server restarted)", "rule", h.l.rule)
		return
	}
	h.schedule()
}

// Lost reports whether the server said the lease had already ended (it
// expired while the server was unreachable, or the server restarted).
func (h *Handle) Lost() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

// Release ends the lease and stops its renewals. It is idempotent and
// bounded in time (the larger of the call timeout and 250ms): when the
// server cannot be reached the lease simply expires there after the rule's
// period, and Release returns an error that is ErrUnavailable.
func (h *Handle) Release() error {
	c := h.l.c
	ctx, cancel := context.WithTimeout(context.Background(), max(c.o.callTimeout, 250*time.Millisecond))
	defer cancel()
	return h.release(ctx)
}

func (h *Handle) release(ctx context.Context) error {
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return nil
	}
	h.released = true
	if h.timer != nil {
		h.timer.Stop()
	}
	lost := h.lost
	h.mu.Unlock()
	c := h.l.c
	c.mu.Lock()
	delete(c.handles, h)
	c.mu.Unlock()
	if h.local != nil {
		c.fb.unhold(h.local)
		return nil
	}
	if h.grant == "" || lost {
		return nil
	}
	n, ctx := c.target(ctx, h.key)
	if n == nil || n.open.Load() {
		return fmt.Errorf("rule %q: release: server unreachable, the lease expires by itself: %w", h.l.rule, ErrUnavailable)
	}
	err := n.invoke(ctx, c.m.rpcRefill, maxRetries, func(ctx context.Context) error {
		_, err := n.tc.RefillToken(ctx, &pb.RefillTokenRequest{Rule: h.l.rule, Key: h.key, GrantId: h.grant})
		return err
	})
	if err != nil {
		return fmt.Errorf("rule %q: release: %v; the lease expires by itself: %w", h.l.rule, causeText(err), ErrUnavailable)
	}
	return nil
}
