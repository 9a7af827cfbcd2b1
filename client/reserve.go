package client

// Cost known after the work: Reserve takes an estimate, Commit settles it.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Reservation is an estimate of cost granted ahead of the work by
// Limiter.Reserve. Commit settles it at what the work really used. It is
// safe for simultaneous use by multiple goroutines.
type Reservation struct {
	l        *Limiter
	key      string
	estimate int64
	grant    string // the server's grant id; empty when decided locally
	decision Decision

	// A local (fallback) reservation is settled once, here; the server
	// keeps that record for server grants.
	mu      sync.Mutex
	settled bool
}

// Settlement is the answer to Reservation.Commit.
type Settlement struct {
	// Remaining is how many permits the key has left after the
	// settlement (0 while in debt).
	Remaining int64
	// Debt is how many permits the key owes: its acquires are denied
	// until the debt is repaid.
	Debt int64
	// RetryAfter, while in debt, is how long until the key admits again.
	RetryAfter time.Duration
}

// Reserve takes an estimate of n permits of key before work whose real
// cost is known only afterwards (LLM tokens, bytes, money); call Commit on
// the returned Reservation with what the work used. A denial is a
// *DeniedError (ErrDenied) carrying the retry-after.
//
// A reservation is always its own grant on the key's owner, never served
// from a lease (see "Reservations" in the package documentation), so that
// Commit settles it against the server's accounting. When no server can
// decide, the fallback policy does, as for AllowN; an auth refusal is
// returned (an *AuthError), never turned into an allow.
func (l *Limiter) Reserve(ctx context.Context, key string, n int64) (*Reservation, error) {
	if n < 0 {
		return nil, fmt.Errorf("rule %q: permits must be >= 0, got %d: %w", l.rule, n, ErrInvalid)
	}
	if err := rule.ValidKey(key); err != nil {
		return nil, fmt.Errorf("rule %q: %w: %w", l.rule, err, ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st := l.c.state.Load()
	ri := st.rules[l.rule]
	var (
		d   Decision
		err error
		res = &Reservation{l: l, key: key, estimate: n}
	)
	if l.c.isClosed() {
		d, err = l.fallback(st, ri, key, n, ErrClosed)
	} else {
		var resp *pb.AcquireTokenResponse
		resp, err = l.ask(ctx, st, key, &pb.AcquireTokenRequest{Rule: l.rule, Key: key, Permits: &n})
		if err == nil {
			d = serverDecision(resp)
			l.count(d)
			res.grant = resp.GetGrantId()
		} else {
			d, err = l.onError(ctx, st, ri, key, n, err)
		}
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if !d.Allowed {
		if err != nil {
			return nil, err
		}
		return nil, &DeniedError{RetryAfter: d.RetryAfter, Reason: "reservation denied: the limit is reached"}
	}
	res.decision = d
	return res, err
}

// Decision is how the reservation was granted (by the server, or by the
// fallback policy).
func (r *Reservation) Decision() Decision { return r.decision }

// Estimate is the number of permits reserved.
func (r *Reservation) Estimate() int64 { return r.estimate }

// Commit settles the reservation at used permits, bounded in time like
// Handle.Release (the larger of the call timeout and 250ms); see
// CommitContext.
func (r *Reservation) Commit(used int64) (Settlement, error) {
	ctx, cancel := context.WithTimeout(context.Background(), max(r.l.c.o.callTimeout, 250*time.Millisecond))
	defer cancel()
	return r.CommitContext(ctx, used)
}

// CommitContext settles the reservation at used permits: less than the
// estimate gives the difference back, more charges the extra even past
// zero (the key is then in debt and denied until it is repaid). The
// server settles a grant once: a repeated commit (a retry after
// ErrUnavailable, which is safe) changes nothing and answers the key's
// current state. Errors: ErrInvalid for used < 0; ErrReservationNotFound
// when the server no longer knows the grant (its reservation TTL passed:
// it stays charged at its estimate; or its node restarted); ErrUnavailable
// when the key's owner cannot be reached (the reservation then stays
// charged at its estimate and expires by itself); an *AuthError when the
// credentials are refused.
//
// A reservation decided by the fallback policy settles locally: for
// LOCAL, an overrun is charged to the local limiter (it waits the debt
// off); nothing is given back.
func (r *Reservation) CommitContext(ctx context.Context, used int64) (Settlement, error) {
	l := r.l
	if used < 0 {
		return Settlement{}, fmt.Errorf("rule %q: used must be >= 0, got %d: %w", l.rule, used, ErrInvalid)
	}
	if r.grant == "" {
		// Decided by the fallback policy, or by the server without a
		// bucket (an allow-listed key, a peek): nothing on the server to
		// settle.
		return r.commitLocal(used), nil
	}
	n, ctx := l.c.target(ctx, r.key)
	if n == nil || n.open.Load() {
		return Settlement{}, fmt.Errorf("rule %q: commit: the key's owner is unreachable, the reservation stays charged at its estimate of %d: %w", l.rule, r.estimate, ErrUnavailable)
	}
	var resp *pb.CommitTokenResponse
	err := n.invoke(ctx, l.c.m.rpcCommit, maxRetries, func(ctx context.Context) (err error) {
		resp, err = n.tc.CommitToken(ctx, &pb.CommitTokenRequest{Rule: l.rule, Key: r.key, GrantId: r.grant, Used: used})
		return err
	})
	if err != nil {
		return Settlement{}, l.commitError(err, r.estimate)
	}
	return Settlement{Remaining: resp.GetRemaining(), Debt: resp.GetDebt(), RetryAfter: time.Duration(resp.GetRetryAfterNs())}, nil
}

// commitError maps a CommitToken error to the SDK's errors.
func (l *Limiter) commitError(err error, estimate int64) error {
	if isAuthError(err) {
		l.c.authRefused(err)
		return fmt.Errorf("rule %q: commit: %w", l.rule, &AuthError{Err: err})
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition:
		return fmt.Errorf("rule %q: commit: %s: %w", l.rule, l.serverMessage(err), ErrInvalid)
	case codes.NotFound:
		return fmt.Errorf("rule %q: commit: %s: %w", l.rule, l.serverMessage(err), ErrReservationNotFound)
	}
	return fmt.Errorf("rule %q: commit: %v; the reservation stays charged at its estimate of %d: %w", l.rule, causeText(err), estimate, ErrUnavailable)
}

// commitLocal settles a reservation the fallback policy granted, once.
func (r *Reservation) commitLocal(used int64) Settlement {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.settled || r.decision.Source != SourceFallback {
		return Settlement{}
	}
	r.settled = true
	l := r.l
	over := used - r.estimate
	if over <= 0 {
		return Settlement{}
	}
	p, limit, period, _ := l.policy(l.c.state.Load().rules[l.rule])
	if p != FallbackLocal || limit <= 0 {
		return Settlement{}
	}
	rem, debt, wait := l.c.fb.debit(l.rule, r.key, over, limit, period, time.Now())
	return Settlement{Remaining: rem, Debt: debt, RetryAfter: wait}
}
