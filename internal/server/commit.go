package server

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"

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
// on the key's owner (forwarding there like RefillToken).
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
	if owner != nil {
		return toOwner(ctx, s.n, owner, func(ctx context.Context, c pb.TokenServiceClient) (*pb.CommitTokenResponse, error) {
			return c.CommitToken(ctx, req)
		})
	}
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
		return nil, toError(err)
	}
	return &pb.CommitTokenResponse{Remaining: res.Remaining, Debt: res.Debt, RetryAfterNs: res.RetryAfter}, nil
}
