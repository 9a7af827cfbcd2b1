package server

import (
	"cmp"
	"context"
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// All-or-nothing batches (AcquireTokensRequest.all_or_nothing) reserve
// every item on its owner, as a plain batch does, and then give back the
// granted ones (a refill by grant, which returns no more than the grant
// took and never above capacity) when any item is denied or fails. Each
// item is a real acquire on the key's owner, so a batch never admits more
// than each key's limit: it cannot over-admit. It may under-admit: from
// an item's grant to its give-back (one round trip to each owner, within
// the call's deadline plus AllOrNothingGiveBack) the item's permits are
// held, and other callers of that key may be denied meanwhile; a give-back
// that cannot reach the owner, or a forwarded item whose answer is lost
// (its grant unknown), leaves those permits spent until the key's bucket
// refills them (at most one period of that key).

// AllOrNothingGiveBack bounds the give-backs of a refused all-or-nothing
// batch, which run even when the caller's deadline has passed.
const AllOrNothingGiveBack = DefaultForwardTimeout

// batchMetrics count all-or-nothing batches. No key is a label.
type batchMetrics struct {
	// allOrNothing counts all-or-nothing batches by result: granted,
	// refused (nothing granted, after giving back what was),
	// give_back_failed (a give-back could not be made).
	allOrNothing *prometheus.CounterVec
}

func newBatchMetrics(reg prometheus.Registerer) *batchMetrics {
	m := &batchMetrics{allOrNothing: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokenserver_all_or_nothing_batches_total",
		Help: "All-or-nothing AcquireTokens batches by result: granted, refused, give_back_failed.",
	}, []string{"result"})}
	reg.MustRegister(m.allOrNothing)
	return m
}

// checkAllOrNothing refuses items whose grant is not all-or-nothing by
// nature (partial grants and leases), before anything is decided.
func checkAllOrNothing(items []*pb.AcquireTokenRequest) error {
	for i, it := range items {
		if it.GetPartial() || it.GetLease() {
			return rule.Invalid("requests[%d]: partial and lease grants cannot be part of an all_or_nothing batch", i)
		}
	}
	return nil
}

// settleAllOrNothing is the second half of an all-or-nothing batch: when
// every item is allowed it changes nothing; otherwise it gives back every
// granted item and answers it denied (granted 0, no grant id), with the
// longest retry_after of the items that were denied. local marks the
// items decided on this node (given back here); the others go to their
// owners through RefillToken's routing.
func (s *tokenService) settleAllOrNothing(ctx context.Context, items []*pb.AcquireTokenRequest, out *pb.AcquireTokensResponse, local []bool) {
	m := s.n.metrics.batches
	var retry int64
	refused := false
	for _, r := range out.GetResults() {
		switch {
		case r.GetStatus().GetCode() != 0 || r.GetResponse() == nil:
			refused = true
		case !r.GetResponse().GetAllowed():
			refused = true
			retry = max(retry, r.GetResponse().GetRetryAfterNs())
		}
	}
	if !refused {
		m.allOrNothing.WithLabelValues("granted").Inc()
		return
	}
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), AllOrNothingGiveBack)
	defer cancel()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed bool
	)
	for i, r := range out.GetResults() {
		resp := r.GetResponse()
		if r.GetStatus().GetCode() != 0 || !resp.GetAllowed() {
			continue
		}
		if id := resp.GetGrantId(); id != "" {
			give := func() {
				if err := s.giveBack(gctx, items[i], id, local[i]); err != nil {
					mu.Lock()
					failed = true
					mu.Unlock()
					s.n.log.Warn("all_or_nothing: a granted item could not be given back; its permits stay spent until its bucket refills them",
						"rule", items[i].GetRule(), "err", err)
				}
			}
			if local[i] {
				give()
			} else {
				wg.Add(1)
				go func() { defer wg.Done(); give() }()
			}
		}
		resp.Allowed, resp.Granted, resp.GrantId, resp.WaitBeforeNs = false, 0, "", 0
		resp.RetryAfterNs = cmp.Or(retry, resp.GetRetryAfterNs())
		resp.ShadowDenied = false
	}
	wg.Wait()
	if failed {
		m.allOrNothing.WithLabelValues("give_back_failed").Inc()
	}
	m.allOrNothing.WithLabelValues("refused").Inc()
}

// giveBack refills all of the grant id of item: on this node when it
// decided the item, else on the key's owner; also there when this node
// handed the key's bucket over since it decided (a move between the
// grant and its give-back), so that the grant is given back once, on
// the state the key goes on with.
func (s *tokenService) giveBack(ctx context.Context, item *pb.AcquireTokenRequest, id string, local bool) error {
	if local {
		c, err := lookup(s.n.data.Table(), item.GetRule(), item.GetKey())
		if err != nil {
			return err
		}
		if _, _, err = s.n.buckets.Refill(c, item.GetKey(), id, -1, s.n.now()); !errors.Is(err, shard.ErrMoved) {
			return err
		}
	}
	_, err := s.RefillToken(ctx, &pb.RefillTokenRequest{Rule: item.GetRule(), Key: item.GetKey(), GrantId: id})
	return err
}
