package server

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/metadata"

	"github.com/tokenserver/tokenserver/internal/handoff"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// costMetrics count the settlement of reservations. Labels are rule names
// and results, never keys.
type costMetrics struct {
	// commits counts CommitToken answers by rule and result: settled,
	// retried (the grant was settled before), expired, not_found.
	commits *prometheus.CounterVec
	// permits counts permits given back and debited by commits, by rule
	// and direction (returned, debited).
	permits *prometheus.CounterVec
}

func newCostMetrics(reg prometheus.Registerer) *costMetrics {
	m := &costMetrics{
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_commits_total",
			Help: "CommitToken answers by rule and result (settled, retried, expired, not_found).",
		}, []string{"rule", "result"}),
		permits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_committed_permits_total",
			Help: "Permits settled by commits, by rule and direction: returned (used below the reservation) or debited (above it).",
		}, []string{"rule", "direction"}),
	}
	reg.MustRegister(m.commits, m.permits)
	return m
}

// CommitToken implements pb.TokenServiceServer: it settles a reservation
// on the key's owner (forwarding there like RefillToken), on the bucket
// the key goes on with while it moves (settle).
func (s *tokenService) CommitToken(ctx context.Context, req *pb.CommitTokenRequest) (*pb.CommitTokenResponse, error) {
	if req.GetUsed() < 0 {
		return nil, toError(failf(ErrBadRequest, "used must be >= 0, got %d", req.GetUsed()))
	}
	if req.GetGrantId() == "" {
		return nil, toError(failf(ErrBadRequest, "grant_id is empty"))
	}
	c, owner, err := s.n.owned(ctx, req.GetRule(), req.GetKey())
	if err != nil {
		return nil, toError(err)
	}
	remote := func(ctx context.Context, tc pb.TokenServiceClient) (*pb.CommitTokenResponse, error) {
		return tc.CommitToken(ctx, req)
	}
	if owner != nil {
		return toOwner(ctx, s.n, owner, remote)
	}
	resp, err := settle(ctx, s.n, c, req.GetKey(), func() (*pb.CommitTokenResponse, error) { return s.commitHere(c, req) }, remote)
	if err != nil {
		return nil, toError(err)
	}
	return resp, nil
}

// commitHere settles req on this node's bucket of the key, and counts it.
func (s *tokenService) commitHere(c *rule.Compiled, req *pb.CommitTokenRequest) (*pb.CommitTokenResponse, error) {
	s.n.installReplica(c, req.GetKey()) // durable rules (replica.go)
	res, err := s.n.buckets.Commit(c, req.GetKey(), req.GetGrantId(), req.GetUsed(), s.n.now())
	s.n.replica.Touch(c, req.GetKey(), 0) // a debt must reach the copy
	m := s.n.metrics.cost
	name := c.Rule.Name
	switch {
	case errors.Is(err, shard.ErrGrantExpired):
		m.commits.WithLabelValues(name, "expired").Inc()
	case errors.Is(err, shard.ErrGrantNotFound):
		m.commits.WithLabelValues(name, "not_found").Inc()
	case err != nil:
	case res.Settled:
		m.commits.WithLabelValues(name, "settled").Inc()
		// Only what moved: each label lookup costs a hash and a lock.
		if res.Returned > 0 {
			m.permits.WithLabelValues(name, "returned").Add(float64(res.Returned))
		}
		if res.Debited > 0 {
			m.permits.WithLabelValues(name, "debited").Add(float64(res.Debited))
		}
	default:
		m.commits.WithLabelValues(name, "retried").Inc()
	}
	if err != nil {
		return nil, err
	}
	return &pb.CommitTokenResponse{Remaining: res.Remaining, Debt: res.Debt, RetryAfterNs: res.RetryAfter}, nil
}

// settle makes a settlement of a grant of key under c (a commit, a
// refill, a renew: local makes it on this node's buckets, remote on
// another node's) on the bucket the key goes on with while it moves, so
// that it is made once and counts (acquires take the same ways, see
// handoffDecide):
//   - On the key's new owner, while its state is in flight, it goes to
//     the old owner (HandoffHeader), which still holds the bucket and
//     settles it there, to travel with the state. Once the old owner has
//     handed the bucket over, or does not answer, it waits for the
//     state within two thirds of the caller's time and is made here; if
//     the state has not come, it is ErrUnavailable and changes nothing
//     (a retry is safe: settlements are idempotent by grant id).
//   - On a node outside its own view that a forwarded settlement reaches
//     (it is coming back and has not yet heard), it goes to the owner in
//     its view likewise (stateElsewhere).
//   - On the old owner, a bucket it handed over (shard.ErrMoved) is
//     settled on the key's owner in the view; when the view gives the
//     key back here, the bucket is thawed and settled here.
func settle[R any](ctx context.Context, n *Node, c *rule.Compiled, key string, local func() (R, error), remote func(context.Context, pb.TokenServiceClient) (R, error)) (R, error) {
	var zero R
	name := c.Rule.Name
	fe := forwardedEpoch(ctx)
	if fe > 0 && asked(ctx) { // fromNewOwner
		if held, _ := n.buckets.Held(name, key); !held {
			if owner, ok := n.data.View().Owner(key); !ok || owner.ID != n.data.ID() {
				return zero, n.notHere(name, key)
			}
		}
		r, err := local()
		if errors.Is(err, shard.ErrMoved) {
			return zero, oldOwnerAnswer(HandedOverReason, "node %s handed the bucket of key %q of rule %q over", n.data.ID(), key, name)
		}
		return r, err
	}
	// As for an acquire (handoffDecide, stateElsewhere): a settlement
	// made on no bucket while the key's state is on its way is lost.
	if old, ok, outside := n.stateElsewhere(name, key); ok {
		start := time.Now()
		left := handoff.DefaultWait
		if dl, ok := ctx.Deadline(); ok {
			left = time.Until(dl)
		}
		actx, cancel := context.WithTimeout(ctx, left/3)
		r, err := toOwner(metadata.AppendToOutgoingContext(actx, HandoffHeader, "1"), n, &old, remote)
		timedOut := err != nil && actx.Err() != nil && ctx.Err() == nil
		cancel()
		switch reason := oldOwnerReason(err); {
		case err == nil:
			return r, nil
		case reason == NotHereReason: // nothing of the key is in flight: here
		case reason == "" && !unreachable(err) && !timedOut:
			return zero, err // the old owner's answer (an unknown grant, a bad request)
		default: // handed over, or the old owner did not answer: wait
			if !n.handoff.WaitKey(ctx, name, key, start.Add(2*left/3), reason == HandedOverReason || outside) {
				return zero, failf(ErrUnavailable, "the state of key %q of rule %q is still on its way from %s; retry (a settlement is idempotent by grant id)", key, name, old.ID)
			}
		}
	}
	if fe > 0 { // (this node's own routing was just now, by its view)
		if owner, stray := n.strayOwner(ctx, fe, name, key); stray {
			return toOwner(ctx, n, &owner, remote)
		}
	}
	r, err := local()
	if !errors.Is(err, shard.ErrMoved) {
		return r, err
	}
	owner, ok := n.data.View().Owner(key)
	if !ok || owner.ID == n.data.ID() {
		// The key came back before a new owner had it: it goes on from
		// the state it left with.
		if n.buckets.Thaw(name, key) {
			n.handoff.MarkStale(name, key)
		}
		return local()
	}
	return toOwner(ctx, n, &owner, remote)
}
