package client

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the client's Prometheus metrics. No key is ever a label.
type metrics struct {
	decisions        *prometheus.CounterVec // rule, source, result
	rpcs             *prometheus.CounterVec // method
	fallback         prometheus.Gauge
	viewEpoch        prometheus.Gauge
	viewMembers      prometheus.Gauge
	defaultAllow     prometheus.Counter
	unknownRule      *prometheus.CounterVec // rule
	leaseTokens      *prometheus.CounterVec // rule, event
	batch            prometheus.Histogram
	authRefused      prometheus.Counter
	limiterConflicts *prometheus.CounterVec // rule

	rpcAcquire, rpcAcquireBatch, rpcRefill, rpcRenew, rpcView, rpcWatch, rpcCommit prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_client_decisions_total",
			Help: "Decisions by rule, source (server, lease, fallback) and result (allowed, denied).",
		}, []string{"rule", "source", "result"}),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_client_rpcs_total",
			Help: "RPCs sent (attempts, retries included), by method.",
		}, []string{"method"}),
		fallback: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenserver_client_fallback",
			Help: "1 while the client decides some calls locally (no view, or a node failing), else 0.",
		}),
		viewEpoch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenserver_client_view_epoch",
			Help: "Epoch of the routing view the client routes by (0: none yet).",
		}),
		viewMembers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokenserver_client_view_members",
			Help: "Members of the routing view the client routes by.",
		}),
		defaultAllow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenserver_client_fallback_default_allow_total",
			Help: "Fallback decisions allowed because neither the rule nor the limiter named a fallback policy.",
		}),
		unknownRule: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_client_unknown_rule_total",
			Help: "Calls for a rule the server says does not exist (decided by the limiter's fallback option, else allowed), by rule.",
		}, []string{"rule"}),
		leaseTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_client_lease_tokens_total",
			Help: "Leased tokens by rule and event: granted, served locally, refilled to the server, expired unused.",
		}, []string{"rule", "event"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tokenserver_client_batch_size",
			Help:    "Items per coalesced acquire RPC.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000},
		}),
		authRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenserver_client_auth_refused_total",
			Help: "Calls the server refused for the client's credentials (Unauthenticated, PermissionDenied, TLS verification); never decided by the fallback.",
		}),
		limiterConflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_client_limiter_option_conflicts_total",
			Help: "Client.Limiter calls for a rule that already had a Limiter with other options (the first options stay), by rule.",
		}, []string{"rule"}),
	}
	m.decisions = register(reg, m.decisions)
	m.rpcs = register(reg, m.rpcs)
	m.fallback = register(reg, m.fallback)
	m.viewEpoch = register(reg, m.viewEpoch)
	m.viewMembers = register(reg, m.viewMembers)
	m.defaultAllow = register(reg, m.defaultAllow)
	m.unknownRule = register(reg, m.unknownRule)
	m.leaseTokens = register(reg, m.leaseTokens)
	m.batch = register(reg, m.batch)
	m.authRefused = register(reg, m.authRefused)
	m.limiterConflicts = register(reg, m.limiterConflicts)
	m.rpcAcquire = m.rpcs.WithLabelValues("AcquireToken")
	m.rpcAcquireBatch = m.rpcs.WithLabelValues("AcquireTokens")
	m.rpcRefill = m.rpcs.WithLabelValues("RefillToken")
	m.rpcRenew = m.rpcs.WithLabelValues("RenewLease")
	m.rpcCommit = m.rpcs.WithLabelValues("CommitToken")
	m.rpcView = m.rpcs.WithLabelValues("GetClusterView")
	m.rpcWatch = m.rpcs.WithLabelValues("WatchClusterView")
	return m
}

// register registers c on reg, or returns the collector already registered
// there (several clients may share a registry).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}

// ruleMetrics are one rule's counters, resolved once per Limiter.
type ruleMetrics struct {
	serverAllowed, serverDenied     prometheus.Counter
	leaseAllowed, leaseDenied       prometheus.Counter
	fallbackAllowed, fallbackDenied prometheus.Counter
	granted, served, refilled       prometheus.Counter
	expired                         prometheus.Counter
}

func (m *metrics) forRule(name string) *ruleMetrics {
	d := func(src, res string) prometheus.Counter { return m.decisions.WithLabelValues(name, src, res) }
	l := func(ev string) prometheus.Counter { return m.leaseTokens.WithLabelValues(name, ev) }
	return &ruleMetrics{
		serverAllowed: d("server", "allowed"), serverDenied: d("server", "denied"),
		leaseAllowed: d("lease", "allowed"), leaseDenied: d("lease", "denied"),
		fallbackAllowed: d("fallback", "allowed"), fallbackDenied: d("fallback", "denied"),
		granted: l("granted"), served: l("served"), refilled: l("refilled"), expired: l("expired"),
	}
}
