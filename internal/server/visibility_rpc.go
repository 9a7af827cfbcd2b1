package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/series"
	"github.com/tokenserver/tokenserver/internal/topk"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Bounds of TopKeys and RuleSeries.
const (
	defaultTopKeys = 20
	maxTopKeys     = 1000
	// peerTopKeys is the least number of keys a node asks each peer for:
	// more than the caller's n, so that the merged top n rarely misses a
	// key that is hot in total but middling on each node (a key a peer
	// leaves out is charged that peer's floor, so the bound still holds).
	peerTopKeys = 100
	// defaultSeriesSpan is RuleSeries' range when the request gives none.
	defaultSeriesSpan = 5 * time.Minute
)

// visibilityRule finds a rule for TopKeys and RuleSeries in the local
// table.
func (n *Node) visibilityRule(name string) (*rule.Compiled, error) {
	if n.vis == nil {
		return nil, failf(ErrUnavailable, "visibility is off on node %s (Config.Visibility)", n.data.ID())
	}
	if err := rule.ValidName(name); err != nil {
		return nil, err
	}
	c := n.data.Table().Get(name)
	if c == nil {
		if !n.data.Ready() {
			return nil, failf(ErrNotReady, "rule %q is not in this node's table yet; retry", name)
		}
		return nil, fmt.Errorf("rule %q: %w", name, rule.ErrNotFound)
	}
	return c, nil
}

// fanOut calls call on every other member of the view concurrently, with
// the forwarded marker and the caller as principal, and returns the ids
// of the members that did not answer before ctx ended. each is called for
// every answer, serialized.
func fanOut[R any](ctx context.Context, n *Node, call func(context.Context, pb.AdminServiceClient) (R, error), each func(R)) []string {
	self := n.data.ID()
	fctx := auth.ForwardContext(markForwarded(ctx))
	var (
		mu      sync.Mutex
		missing []string
		wg      sync.WaitGroup
	)
	for _, m := range n.data.View().Members() {
		if m.ID == self {
			continue
		}
		wg.Add(1)
		go func(m cluster.Member) {
			defer wg.Done()
			var r R
			conn, err := n.peers.conn(m.GRPCAddr)
			if err == nil {
				r, err = call(fctx, pb.NewAdminServiceClient(conn))
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				n.log.Debug("visibility: peer did not answer", "member", m.ID, "err", err)
				missing = append(missing, m.ID)
				return
			}
			each(r)
		}(m)
	}
	wg.Wait()
	return missing
}

// TopKeys implements pb.AdminServiceServer: the rule's hottest keys over
// the window, merged over every member's sketch unless local is set.
func (s *adminService) TopKeys(ctx context.Context, req *pb.TopKeysRequest) (*pb.TopKeysResponse, error) {
	n := s.n
	c, err := n.visibilityRule(req.GetRule())
	if err != nil {
		return nil, toError(err)
	}
	k := int(req.GetN())
	switch {
	case k < 0:
		return nil, toError(failf(ErrBadRequest, "n must be >= 0, got %d", k))
	case k == 0:
		k = defaultTopKeys
	case k > maxTopKeys:
		k = maxTopKeys
	}
	w := topk.Minute
	switch req.GetWindow() {
	case pb.TopKeysWindow_TOP_KEYS_WINDOW_UNSPECIFIED, pb.TopKeysWindow_MINUTE:
	case pb.TopKeysWindow_HOUR:
		w = topk.Hour
	default:
		return nil, toError(failf(ErrBadRequest, "window %d is not MINUTE or HOUR", req.GetWindow()))
	}
	var local topk.Summary
	if rv := n.visibilityOf(c); rv != nil {
		local = rv.sketch.Snapshot(n.vis.wall(), w, req.GetDenied())
	}
	if req.GetLocal() {
		return summaryToPB(local.Truncate(k)), nil
	}
	peerReq := &pb.TopKeysRequest{Rule: req.GetRule(), N: int32(min(maxTopKeys, max(4*k, peerTopKeys))), Window: req.GetWindow(), Denied: req.GetDenied(), Local: true}
	parts := []topk.Summary{local}
	missing := fanOut(ctx, n, func(ctx context.Context, c pb.AdminServiceClient) (*pb.TopKeysResponse, error) {
		r, err := c.TopKeys(ctx, peerReq)
		if err != nil {
			return nil, err
		}
		if err := summaryFromPB(r).Validate(); err != nil {
			return nil, fmt.Errorf("peer top keys: %w", err)
		}
		return r, nil
	}, func(r *pb.TopKeysResponse) { parts = append(parts, summaryFromPB(r)) })
	out := summaryToPB(topk.Merge(parts...).Truncate(k))
	out.MissingNodes = missing
	return out, nil
}

func summaryToPB(s topk.Summary) *pb.TopKeysResponse {
	out := &pb.TopKeysResponse{Floor: s.Floor, Total: s.Total, Keys: make([]*pb.TopKey, len(s.Entries))}
	for i, e := range s.Entries {
		out.Keys[i] = &pb.TopKey{Key: e.Key, Count: e.Count, Error: e.Error}
	}
	return out
}

func summaryFromPB(r *pb.TopKeysResponse) topk.Summary {
	s := topk.Summary{Floor: r.GetFloor(), Total: r.GetTotal(), Entries: make([]topk.Entry, len(r.GetKeys()))}
	for i, k := range r.GetKeys() {
		s.Entries[i] = topk.Entry{Key: k.GetKey(), Count: k.GetCount(), Error: k.GetError()}
	}
	return s
}

// RuleSeries implements pb.AdminServiceServer: the rule's decisions per
// second, summed over every member unless local is set, with utilisation
// against the rule's current limit.
func (s *adminService) RuleSeries(ctx context.Context, req *pb.RuleSeriesRequest) (*pb.RuleSeriesResponse, error) {
	n := s.n
	c, err := n.visibilityRule(req.GetRule())
	if err != nil {
		return nil, toError(err)
	}
	now := n.vis.wall()
	to := req.GetToUnix()
	if to == 0 {
		to = now / int64(time.Second)
	}
	from := req.GetFromUnix()
	if from == 0 {
		from = to - int64(defaultSeriesSpan/time.Second) + 1
	}
	if from > to {
		return nil, toError(failf(ErrBadRequest, "from_unix %d is after to_unix %d", from, to))
	}
	var local []series.Point
	if rv := n.visibilityOf(c); rv != nil {
		local = rv.series.Range(now, from*int64(time.Second), to*int64(time.Second))
	} else {
		local = new(series.Series).Range(now, from*int64(time.Second), to*int64(time.Second))
	}
	parts := [][]series.Point{local}
	var missing []string
	if !req.GetLocal() {
		peerReq := &pb.RuleSeriesRequest{Rule: req.GetRule(), FromUnix: from, ToUnix: to, Local: true}
		missing = fanOut(ctx, n, func(ctx context.Context, c pb.AdminServiceClient) (*pb.RuleSeriesResponse, error) {
			return c.RuleSeries(ctx, peerReq)
		}, func(r *pb.RuleSeriesResponse) { parts = append(parts, pointsFromPB(r.GetPoints(), from, to)) })
	}
	merged := series.Merge(parts...)
	out := &pb.RuleSeriesResponse{Points: make([]*pb.SeriesPoint, len(merged)), MissingNodes: missing}
	for i, p := range merged {
		out.Points[i] = &pb.SeriesPoint{Unix: p.Time / int64(time.Second), Admitted: p.Admitted, Denied: p.Denied,
			ShadowDenied: p.ShadowDenied, Permits: p.Permits, Utilisation: p.Utilisation(c.Rule.Limit, c.Rule.Period)}
	}
	return out, nil
}

// pointsFromPB reads a peer's points, keeping those in [from, to].
func pointsFromPB(ps []*pb.SeriesPoint, from, to int64) []series.Point {
	out := make([]series.Point, 0, len(ps))
	for _, p := range ps {
		if p.GetUnix() < from || p.GetUnix() > to {
			continue
		}
		out = append(out, series.Point{Time: p.GetUnix() * int64(time.Second), Admitted: p.GetAdmitted(),
			Denied: p.GetDenied(), ShadowDenied: p.GetShadowDenied(), Permits: p.GetPermits()})
	}
	return out
}
