package server

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/tokenserver/tokenserver/internal/series"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Bounds of ListRuleRates.
const (
	defaultRatesWindow = 10 // seconds
	maxRatesWindow     = 60
	defaultRatesSteps  = 60 // one a minute
	hourSeconds        = 3600
)

// ListRuleRates implements pb.AdminServiceServer: every rule with
// decisions in the last hour on some node (or a non-zero over-admission
// bound), with its figures over the window and the hour and its bound now,
// summed over every member unless local is set. One
// call per member, whatever the number of rules: the console's rules list
// uses it instead of a RuleSeries per rule.
func (s *adminService) ListRuleRates(ctx context.Context, req *pb.ListRuleRatesRequest) (*pb.ListRuleRatesResponse, error) {
	n := s.n
	if n.vis == nil {
		return nil, toError(failf(ErrUnavailable, "visibility is off on node %s (Config.Visibility)", n.data.ID()))
	}
	window, steps := int64(req.GetWindowSeconds()), int64(req.GetSteps())
	switch {
	case window == 0:
		window = defaultRatesWindow
	case window < 0 || window > maxRatesWindow:
		return nil, toError(failf(ErrBadRequest, "window_seconds %d: must be 1 to %d", window, maxRatesWindow))
	}
	switch {
	case steps == 0:
		steps = defaultRatesSteps
	case steps < 0 || steps > hourSeconds || hourSeconds%steps != 0:
		return nil, toError(failf(ErrBadRequest, "steps %d: must divide %d", steps, hourSeconds))
	}
	to := req.GetToUnix()
	if to == 0 {
		to = n.vis.wall() / int64(time.Second)
	}
	byRule := n.localRuleRates(to, window, steps)
	out := &pb.ListRuleRatesResponse{ToUnix: to, WindowSeconds: int32(window), Steps: int32(steps)}
	if !req.GetLocal() {
		peerReq := &pb.ListRuleRatesRequest{ToUnix: to, WindowSeconds: int32(window), Steps: int32(steps), Local: true}
		out.MissingNodes = fanOut(ctx, n, func(ctx context.Context, c pb.AdminServiceClient) (*pb.ListRuleRatesResponse, error) {
			return c.ListRuleRates(ctx, peerReq)
		}, func(r *pb.ListRuleRatesResponse) {
			for _, pr := range r.GetRates() {
				addRate(byRule, pr, steps)
			}
		})
	}
	out.Rates = make([]*pb.RuleRate, 0, len(byRule))
	for _, r := range byRule {
		out.Rates = append(out.Rates, r)
	}
	slices.SortFunc(out.Rates, func(a, b *pb.RuleRate) int {
		switch {
		case a.Rule < b.Rule:
			return -1
		case a.Rule > b.Rule:
			return 1
		}
		return 0
	})
	return out, nil
}

// addRate adds a peer's figures for one rule to byRule (a peer's
// sparkline of another length is ignored: it answered other steps).
func addRate(byRule map[string]*pb.RuleRate, pr *pb.RuleRate, steps int64) {
	r := byRule[pr.GetRule()]
	if r == nil {
		r = &pb.RuleRate{Rule: pr.GetRule(), Sparkline: make([]int64, steps)}
		byRule[pr.GetRule()] = r
	}
	r.Admitted += pr.GetAdmitted()
	r.Denied += pr.GetDenied()
	r.ShadowDenied += pr.GetShadowDenied()
	r.Permits += pr.GetPermits()
	r.OveradmissionBoundPermits += pr.GetOveradmissionBoundPermits()
	if int64(len(pr.GetSparkline())) == steps {
		for i, v := range pr.GetSparkline() {
			r.Sparkline[i] += v
		}
	}
}

// localRuleRates is this node's figures for every rule of its table that
// decided here in the hour ending at the second to, or whose
// over-admission bound here is not 0: sums over the window ending at to,
// the hour in steps, and the bound now.
func (n *Node) localRuleRates(to, window, steps int64) map[string]*pb.RuleRate {
	out := map[string]*pb.RuleRate{}
	now := n.vis.wall()
	toNs := to * int64(time.Second)
	width := hourSeconds / steps
	wall := time.Now()
	for _, r := range n.data.Table().Rules() {
		c := n.data.Table().Get(r.Name)
		if c == nil {
			continue
		}
		bound := n.bound.Permits(c, wall)
		rv := n.visibilityOf(c)
		if rv == nil {
			if bound > 0 {
				out[r.Name] = &pb.RuleRate{Rule: r.Name, Sparkline: make([]int64, steps), OveradmissionBoundPermits: bound}
			}
			continue
		}
		hour := rv.series.Sums(now, toNs-(hourSeconds-1)*int64(time.Second), toNs, width)
		recent := rv.series.Sums(now, toNs-(window-1)*int64(time.Second), toNs, window)
		rr := &pb.RuleRate{Rule: r.Name, Sparkline: make([]int64, len(hour)), OveradmissionBoundPermits: bound}
		active := false
		for i, p := range hour {
			rr.Sparkline[i] = p.Admitted + p.Denied + p.ShadowDenied
			active = active || rr.Sparkline[i] > 0
		}
		if !active && bound == 0 {
			continue
		}
		if len(recent) == 1 {
			rr.Admitted, rr.Denied, rr.ShadowDenied, rr.Permits = recent[0].Admitted, recent[0].Denied, recent[0].ShadowDenied, recent[0].Permits
		}
		out[r.Name] = rr
	}
	return out
}

// ruleRatesTTL is how long the console reuses the cluster's rule rates:
// a rules page refreshing every few seconds, or many operators watching
// it, cost one ListRuleRates (one call per member) per second at most.
const ruleRatesTTL = time.Second

// ruleRatesCache holds the last ListRuleRates answer for the console.
// Fetches are serialized: callers arriving during one wait for it and
// share its answer.
type ruleRatesCache struct {
	mu      sync.Mutex
	at      time.Time
	byRule  map[string]*pb.RuleRate
	window  int64
	missing []string
}

// get returns the rates, fetching them with fetch when older than ttl.
func (c *ruleRatesCache) get(now time.Time, fetch func() (*pb.ListRuleRatesResponse, error)) (map[string]*pb.RuleRate, int64, []string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byRule != nil && now.Sub(c.at) < ruleRatesTTL && now.Sub(c.at) >= 0 {
		return c.byRule, c.window, c.missing, nil
	}
	resp, err := fetch()
	if err != nil {
		return nil, 0, nil, err
	}
	c.byRule = make(map[string]*pb.RuleRate, len(resp.GetRates()))
	for _, r := range resp.GetRates() {
		c.byRule[r.GetRule()] = r
	}
	c.at, c.window, c.missing = now, int64(resp.GetWindowSeconds()), resp.GetMissingNodes()
	return c.byRule, c.window, c.missing, nil
}

// utilisationOf is admitted permits over the window against the rule's
// limit, as series.Point.Utilisation computes it per second, averaged.
func utilisationOf(r *pb.RuleRate, window int64, limit int64, period time.Duration) float64 {
	p := series.Point{Admitted: r.GetAdmitted(), Denied: r.GetDenied(), ShadowDenied: r.GetShadowDenied(), Permits: r.GetPermits()}
	return p.Utilisation(limit, period) / float64(window)
}
