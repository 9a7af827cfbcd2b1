package envoyrls

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultDetailedCap is the default number of detailed rule labels (from
// detailed_metric or value_to_metric, which hold request values) per domain;
// past it, hits count under the configured rule's label.
const DefaultDetailedCap = 100

type stat int

const (
	statTotalHits stat = iota
	statOverLimit
	statNearLimit
	statWithinLimit
	statShadowMode
	numStats
)

var statNames = [numStats]string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"}

// Metrics are the reference's per-rule statistics as Prometheus counters,
// tokenserver_envoy_<stat>_total{domain, rule}: rule is the configured
// descriptor path (key1_value1.subkey1), never a request value unless the
// descriptor asks with detailed_metric or value_to_metric, and then at most
// a capped number per domain. A nil *Metrics counts nothing.
type Metrics struct {
	counters       [numStats]*prometheus.CounterVec
	unknown        prometheus.Counter
	detailedCap    int
	mu             sync.Mutex
	detailed       map[string]map[string]bool // domain → detailed labels in use
	detailedDenied prometheus.Counter
}

// NewMetrics registers the counters with reg. detailedCap bounds the
// detailed labels per domain (0: DefaultDetailedCap).
func NewMetrics(reg prometheus.Registerer, detailedCap int) (*Metrics, error) {
	if detailedCap <= 0 {
		detailedCap = DefaultDetailedCap
	}
	m := &Metrics{detailedCap: detailedCap, detailed: map[string]map[string]bool{}}
	help := [numStats]string{
		"Hits on an Envoy rate limit rule, by domain and rule (the reference's total_hits).",
		"Hits over the limit of an Envoy rate limit rule (over_limit).",
		"Hits over the near-limit ratio but within the limit (near_limit).",
		"Hits within the limit (within_limit).",
		"Hits over the limit that shadow_mode answered OK (shadow_mode).",
	}
	for i := range m.counters {
		m.counters[i] = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_envoy_" + statNames[i] + "_total",
			Help: help[i],
		}, []string{"domain", "rule"})
	}
	m.unknown = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tokenserver_envoy_unknown_domain_total",
		Help: "Envoy rate limit requests for a domain no configuration defines (answered OK).",
	})
	m.detailedDenied = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tokenserver_envoy_detailed_labels_capped_total",
		Help: "Hits counted under the configured rule's label because the domain's detailed labels reached their cap.",
	})
	cs := []prometheus.Collector{m.unknown, m.detailedDenied}
	for _, c := range m.counters {
		cs = append(cs, c)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register envoy metrics: %w", err)
		}
	}
	return m, nil
}

// rule is the label for l: DetailedRule while the domain is under the cap,
// else Rule.
func (m *Metrics) rule(l *Limit) string {
	if m == nil {
		return ""
	}
	if l.DetailedRule == "" {
		return l.Rule
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.detailed[l.Domain]
	if set[l.DetailedRule] {
		return l.DetailedRule
	}
	if len(set) >= m.detailedCap {
		m.detailedDenied.Inc()
		return l.Rule
	}
	if set == nil {
		set = map[string]bool{}
		m.detailed[l.Domain] = set
	}
	set[l.DetailedRule] = true
	return l.DetailedRule
}

// ruleStats are the counters of one (domain, rule) label pair, each
// resolved from its CounterVec on its first non-zero add (so a series
// appears only once it counts, as with WithLabelValues at each add) and
// kept: the vectors never delete a child. A configured limit caches them
// on its spec, which saves hashing the labels on every hit.
type ruleStats struct {
	m            *Metrics
	domain, rule string
	cached       bool
	c            [numStats]atomic.Pointer[statCounter]
}

type statCounter struct{ prometheus.Counter }

// stats returns the counters of l under its label (see rule): cached on
// l's spec for its configured rule label, else resolved at each add. nil
// counts nothing.
func (m *Metrics) stats(l *Limit) *ruleStats {
	if m == nil {
		return nil
	}
	label := m.rule(l)
	sp := l.spec
	if sp == nil || label != l.Rule {
		return &ruleStats{m: m, domain: l.Domain, rule: label}
	}
	if r := sp.stats.Load(); r != nil && r.m == m && r.domain == l.Domain && r.rule == label {
		return r
	}
	r := &ruleStats{m: m, domain: l.Domain, rule: label, cached: true}
	sp.stats.Store(r)
	return r
}

func (r *ruleStats) add(s stat, n uint64) {
	if r == nil || n == 0 {
		return
	}
	if !r.cached {
		r.m.counters[s].WithLabelValues(r.domain, r.rule).Add(float64(n))
		return
	}
	c := r.c[s].Load()
	if c == nil {
		c = &statCounter{r.m.counters[s].WithLabelValues(r.domain, r.rule)}
		r.c[s].Store(c)
	}
	c.Add(float64(n))
}

func (m *Metrics) unknownDomain() {
	if m != nil {
		m.unknown.Inc()
	}
}
