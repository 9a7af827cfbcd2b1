package client

// All-or-nothing budgets across levels (org > team > user).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Item is one part of an AllowAll: N permits of Key under Rule.
type Item struct {
	Rule string
	Key  string
	N    int64
}

// AllDecision is the answer to AllowAll.
type AllDecision struct {
	// Allowed reports whether every item was granted; when false, none
	// was.
	Allowed bool
	// RetryAfter, when denied, is the longest retry-after among the
	// denied items.
	RetryAfter time.Duration
	// Items are the decisions per item, in the order given. When the
	// whole was denied, items the server had granted show Allowed false:
	// their permits were given back.
	Items []Decision
}

// AllowAll asks for every item at once, all or nothing: the org, team and
// user budgets of one request are granted together, or none is charged.
// It sends one AcquireTokens with all_or_nothing to the owner of the
// first item's key; the server reserves each item on its own owner and
// gives the granted ones back when any is denied. The SDK checks the
// answer too: should any item come back granted while another was denied
// or failed (a server that predates all_or_nothing), it gives the granted
// ones back itself. So AllowAll never over-admits; while a give-back is
// in flight the granted items briefly hold their permits (under-admission
// of at most the items' permits, for one round trip).
//
// Errors: ErrInvalid for a bad item (the whole is denied); ErrNotFound
// when an item's rule does not exist (denied); an *AuthError when the
// credentials are refused (denied). When no server can decide, each
// item's rule's fallback policy decides, in order, and the whole is
// allowed only if every item is (a LOCAL fallback may then have charged
// earlier items locally: under-admission, never over).
func (c *Client) AllowAll(ctx context.Context, items ...Item) (AllDecision, error) {
	if len(items) == 0 {
		return AllDecision{Allowed: true}, nil
	}
	if len(items) > MaxBatch {
		return AllDecision{}, fmt.Errorf("AllowAll: %d items, above the limit of %d: %w", len(items), MaxBatch, ErrInvalid)
	}
	req := &pb.AcquireTokensRequest{AllOrNothing: true, Requests: make([]*pb.AcquireTokenRequest, len(items))}
	for i, it := range items {
		if it.N < 0 {
			return AllDecision{}, fmt.Errorf("AllowAll: item %d (rule %q): permits must be >= 0, got %d: %w", i, it.Rule, it.N, ErrInvalid)
		}
		if err := rule.ValidKey(it.Key); err != nil {
			return AllDecision{}, fmt.Errorf("AllowAll: item %d (rule %q): %w: %w", i, it.Rule, err, ErrInvalid)
		}
		n := it.N
		req.Requests[i] = &pb.AcquireTokenRequest{Rule: it.Rule, Key: it.Key, Permits: &n}
	}
	if err := ctx.Err(); err != nil {
		return AllDecision{}, err
	}
	if c.isClosed() {
		return c.allowAllFallback(items, ErrClosed)
	}
	cctx, cancel := c.callContext(ctx)
	defer cancel()
	n, cctx := c.target(cctx, items[0].Key)
	if n == nil || n.open.Load() {
		return c.allowAllFallback(items, status.Error(codes.Unavailable, "no reachable member for the first item's key"))
	}
	var resp *pb.AcquireTokensResponse
	budget := n.budget(cctx)
	err := n.invoke(cctx, c.m.rpcAcquireBatch, maxRetries, func(ctx context.Context) (err error) {
		resp, err = n.tc.AcquireTokens(ctx, req)
		return err
	})
	n.record(cctx, budget, err)
	if err == nil && len(resp.GetResults()) != len(items) {
		err = status.Errorf(codes.Internal, "server answered %d items for %d", len(resp.GetResults()), len(items))
	}
	if err != nil {
		if isAuthError(err) {
			c.authRefused(err)
			return AllDecision{Items: make([]Decision, len(items))}, fmt.Errorf("AllowAll: %w", &AuthError{Err: err})
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition:
			return AllDecision{Items: make([]Decision, len(items))}, fmt.Errorf("AllowAll: %s: %w", status.Convert(err).Message(), ErrInvalid)
		}
		if ctx.Err() == context.Canceled {
			return AllDecision{}, ctx.Err()
		}
		return c.allowAllFallback(items, err)
	}
	return c.allowAllAnswer(items, resp)
}

// allowAllAnswer turns the server's answer into an AllDecision, giving
// back what was granted when the whole is denied.
func (c *Client) allowAllAnswer(items []Item, resp *pb.AcquireTokensResponse) (AllDecision, error) {
	out := AllDecision{Allowed: true, Items: make([]Decision, len(items))}
	var firstErr error
	for i, res := range resp.GetResults() {
		if st := res.GetStatus(); st != nil && codes.Code(st.GetCode()) != codes.OK {
			out.Allowed = false
			if firstErr == nil {
				firstErr = c.itemError(items[i], status.ErrorProto(st))
			}
			continue
		}
		d := serverDecision(res.GetResponse())
		out.Items[i] = d
		if !d.Allowed {
			out.Allowed = false
			out.RetryAfter = max(out.RetryAfter, d.RetryAfter)
		}
	}
	if !out.Allowed {
		for i, res := range resp.GetResults() {
			r := res.GetResponse()
			if r.GetAllowed() && r.GetGrantId() != "" {
				c.giveBack(items[i], r.GetGrantId())
			}
			out.Items[i].Allowed = false
		}
	}
	for i := range items {
		c.limiterFor(items[i].Rule).count(out.Items[i])
	}
	return out, firstErr
}

// itemError maps one item's failed status to the SDK's errors.
func (c *Client) itemError(it Item, err error) error {
	if isAuthError(err) {
		c.authRefused(err)
		return fmt.Errorf("AllowAll: rule %q: %w", it.Rule, &AuthError{Err: err})
	}
	msg := status.Convert(err).Message()
	switch status.Code(err) {
	case codes.NotFound:
		return fmt.Errorf("AllowAll: rule %q: %s: %w", it.Rule, msg, ErrNotFound)
	case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition:
		return fmt.Errorf("AllowAll: rule %q key %q: %s: %w", it.Rule, it.Key, msg, ErrInvalid)
	}
	return fmt.Errorf("AllowAll: rule %q key %q: %s: %w", it.Rule, it.Key, causeText(err), ErrUnavailable)
}

// giveBack refills a grant of an item of a denied AllowAll.
func (c *Client) giveBack(it Item, grantID string) {
	ctx, cancel := context.WithTimeout(c.ctx, max(c.o.callTimeout, 250*time.Millisecond))
	defer cancel()
	n, ctx := c.target(ctx, it.Key)
	if n == nil {
		return
	}
	err := n.invoke(ctx, c.m.rpcRefill, maxRetries, func(ctx context.Context) error {
		_, err := n.tc.RefillToken(ctx, &pb.RefillTokenRequest{Rule: it.Rule, Key: it.Key, GrantId: grantID})
		return err
	})
	if err != nil {
		c.log.Warn("tokenserver client: AllowAll could not give a granted item back; it stays charged until its window passes",
			"rule", it.Rule, "err", err)
	}
}

// allowAllFallback decides every item by its rule's fallback policy
// because no server could: allowed only when every item is.
func (c *Client) allowAllFallback(items []Item, cause error) (AllDecision, error) {
	out := AllDecision{Allowed: true, Items: make([]Decision, len(items))}
	st := c.state.Load()
	for i, it := range items {
		l := c.limiterFor(it.Rule)
		d, err := l.fallback(st, st.rules[it.Rule], it.Key, it.N, cause)
		out.Items[i] = d
		if err != nil || !d.Allowed {
			out.Allowed = false
			out.RetryAfter = max(out.RetryAfter, d.RetryAfter)
			for j := range out.Items {
				out.Items[j].Allowed = false
			}
			if err == nil || errors.Is(err, ErrClosed) {
				err = fmt.Errorf("AllowAll: rule %q: server unavailable (%v) and the fallback policy denies: %w", it.Rule, causeText(cause), ErrUnavailable)
			}
			return out, err
		}
	}
	return out, nil
}

// limiterFor returns the rule's Limiter as it is, or a new one without
// options: AllowAll uses the options an application gave, and never
// conflicts with them.
func (c *Client) limiterFor(ruleName string) *Limiter {
	c.mu.Lock()
	l := c.limiters[ruleName]
	c.mu.Unlock()
	if l != nil {
		return l
	}
	l, _ = c.LimiterE(ruleName)
	return l
}
