package auth

// Revocation of live streams, and the checks of a peer's identity against
// the cluster's membership.

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrRevoked is the cause of a Revocable context that ended because its
// principal went away (its token left the token file or changed roles, its
// certificate was denied, its node left the membership), and the status a
// stream ended that way returns (see StreamError).
var ErrRevoked = status.Error(codes.Unauthenticated, "the credential of this stream was revoked")

// liveStreams are the streams under way, to end when their principal
// goes.
type liveStreams struct {
	mu sync.Mutex
	m  map[*liveStream]struct{}
}

type liveStream struct {
	p      *Principal
	cancel context.CancelCauseFunc
}

// Revocable returns ctx, carrying the principal Authorize put in it,
// derived so that it ends, with cause ErrRevoked, once that principal is
// revoked: at a token file reload that drops or changes its token, or at
// Recheck (a certificate now denied, a node that left the membership). A
// stream handler that honors its context then returns; StreamError turns
// its error into ErrRevoked. stop releases the context; call it when the
// stream ends. Without a principal (auth off, open methods) ctx is
// returned as is.
func (a *Authenticator) Revocable(ctx context.Context) (_ context.Context, stop func()) {
	p, ok := FromContext(ctx)
	if !ok {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	s := &liveStream{p: p, cancel: cancel}
	a.live.mu.Lock()
	if a.live.m == nil {
		a.live.m = map[*liveStream]struct{}{}
	}
	a.live.m[s] = struct{}{}
	a.live.mu.Unlock()
	if !a.valid(p) { // revoked between Authorize and now
		cancel(ErrRevoked)
	}
	return ctx, func() {
		a.live.mu.Lock()
		delete(a.live.m, s)
		a.live.mu.Unlock()
		cancel(context.Canceled)
	}
}

// Recheck ends the Revocable contexts whose principal is no longer valid:
// the server calls it after a membership change and after the certificate
// deny list changes; a token file reload calls it itself.
func (a *Authenticator) Recheck() {
	a.live.mu.Lock()
	var gone []*liveStream
	for s := range a.live.m {
		if !a.valid(s.p) {
			gone = append(gone, s)
		}
	}
	a.live.mu.Unlock()
	for _, s := range gone {
		a.log.Info("auth: ending a stream: its principal was revoked", "principal", s.p.String())
		s.cancel(ErrRevoked)
	}
}

// LiveStreams counts the Revocable contexts in use.
func (a *Authenticator) LiveStreams() int {
	a.live.mu.Lock()
	defer a.live.mu.Unlock()
	return len(a.live.m)
}

// valid reports whether p would still be admitted as it was: its token
// still maps to the same name and roles, its certificate is not denied,
// its node is still a member.
func (a *Authenticator) valid(p *Principal) bool {
	if p.leaf != nil && a.o.CertDenied != nil && a.o.CertDenied(p.leaf) {
		return false
	}
	switch p.Source {
	case SourceToken:
		q := (*a.tokens.Load())[p.digest]
		return q != nil && q.Name == p.Name && q.Roles == p.Roles
	case SourcePeer:
		if p.Joining || p.NodeID == "" || a.o.Members == nil {
			return true
		}
		return a.o.Members(p.NodeID)
	}
	return true
}

// StreamError is the error a stream handler returned, as its caller sees
// it: ErrRevoked when ctx (from Revocable) ended for that reason.
func StreamError(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), ErrRevoked) {
		return ErrRevoked
	}
	return err
}

// CheckJoin checks that a JoinCluster for node id may proceed as far as
// the caller's identity goes: a peer joins only as itself (its certificate
// names id in a tokenserver://node/ID URI SAN). A member peer's join that
// another member forwarded (forwarded: the call carries the forwarded
// marker) was checked where it arrived; a node that is not a member yet
// (Principal.Joining) is always checked, forwarded marker or not. A peer
// certificate that names no node id (a CA of peers only), and callers
// that are not peers (an admin's join), are left to the join probe, which
// asks the Raft address who it is. The error is PermissionDenied.
func CheckJoin(ctx context.Context, id string, forwarded bool) error {
	p, ok := FromContext(ctx)
	if !ok || !p.IsPeer() {
		return nil
	}
	if !p.Joining && (forwarded || p.NodeID == "") {
		return nil
	}
	if PeerNamesNode(ctx, id) {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "%s may join only as itself, not as %q", p, id)
}
