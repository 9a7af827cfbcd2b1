package server

import (
	"net/http"
	"time"

	"github.com/tokenserver/tokenserver/internal/buildinfo"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// metrics are the node's Prometheus metrics, on a private registry. Never
// is a key a label: labels are rule names, gRPC methods, codes and peers.
type metrics struct {
	reg       *prometheus.Registry
	latency   *prometheus.HistogramVec
	batch     prometheus.Histogram
	errors    *prometheus.CounterVec
	forwarded *prometheus.CounterVec
	failovers prometheus.Counter
	apply     prometheus.Histogram
	panics    prometheus.Counter
	cost      *costMetrics
	batches   *batchMetrics
	// methods are the latency observers of the TokenService methods that
	// decide (acquire, refill, renew; not the cluster view).
	methods map[string]prometheus.Observer
	// admin counts AdminService calls by method and code.
	admin        map[string]adminCounter
	adminCalls   *prometheus.CounterVec
	authFailures *prometheus.CounterVec
	ruleConfirms prometheus.Counter
}

// adminCounter counts one AdminService method's calls.
type adminCounter struct {
	vec    *prometheus.CounterVec
	method string
}

func (a adminCounter) observe(c codes.Code) { a.vec.WithLabelValues(a.method, c.String()).Inc() }

// decisionMethods are the TokenService methods timed in
// tokenserver_decision_duration_seconds.
var decisionMethods = map[string]bool{"AcquireToken": true, "AcquireTokens": true, "RefillToken": true, "RenewLease": true}

func newMetrics(n *Node) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenserver_panics_total",
			Help: "Panics in gRPC handlers, answered INTERNAL instead of taking the node down (each one is a bug: see the log).",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tokenserver_decision_duration_seconds",
			Help:    "Time to answer a data-plane call on this node (forwarding included), by gRPC method.",
			Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1},
		}, []string{"method"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tokenserver_batch_size",
			Help:    "Items per AcquireTokens call.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_errors_total",
			Help: "Data-plane items answered with an error, by gRPC code.",
		}, []string{"code"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_forwarded_requests_total",
			Help: "Data-plane calls forwarded to the key's owner, by owner node id.",
		}, []string{"peer"}),
		failovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenserver_owner_failovers_total",
			Help: "Data-plane calls sent to a key's next owner (or decided here) because its owner could not be reached.",
		}),
		adminCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_admin_requests_total",
			Help: "AdminService calls answered by this node, by method and gRPC code.",
		}, []string{"method", "code"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokenserver_auth_failures_total",
			Help: "gRPC calls refused by authentication or authorization, by gRPC code (Unauthenticated, PermissionDenied).",
		}, []string{"code"}),
		ruleConfirms: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokenserver_rule_confirmations_total",
			Help: "Data-plane calls for a rule this node did not know, checked with the leader before answering NOT_FOUND.",
		}),
		apply: n.hooks.apply,
	}
	m.methods = map[string]prometheus.Observer{}
	for _, md := range pb.TokenService_ServiceDesc.Methods {
		if !decisionMethods[md.MethodName] {
			continue
		}
		full := "/" + pb.TokenService_ServiceDesc.ServiceName + "/" + md.MethodName
		m.methods[full] = m.latency.WithLabelValues(md.MethodName)
	}
	m.admin = map[string]adminCounter{}
	for _, md := range pb.AdminService_ServiceDesc.Methods {
		m.admin["/"+pb.AdminService_ServiceDesc.ServiceName+"/"+md.MethodName] = adminCounter{vec: m.adminCalls, method: md.MethodName}
	}
	b := buildinfo.Read()
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tokenserver_build_info",
		Help: "Always 1; its labels name the build: module version, VCS revision, Go version.",
	}, []string{"version", "revision", "goversion"})
	buildInfo.WithLabelValues(b.Version, b.Revision, b.GoVersion).Set(1)
	m.reg.MustRegister(buildInfo)
	m.cost = newCostMetrics(m.reg)
	m.batches = newBatchMetrics(m.reg)
	m.reg.MustRegister(m.latency, m.batch, m.adminCalls, m.authFailures, m.ruleConfirms, m.errors, m.forwarded, m.failovers, m.apply, m.panics,
		&nodeCollector{n: n},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The reload state of the TLS files and of the token file, and the
	// certificates' expiry (tokenserver_tls_cert_not_after_seconds), are
	// theirs to export. A registration error is a duplicate name: a bug,
	// as with MustRegister above.
	if sec := &n.cfg.Security; sec.TLS != nil {
		if err := sec.TLS.RegisterMetrics(m.reg); err != nil {
			panic(err)
		}
	}
	if a := n.cfg.Security.Auth; a != nil {
		if err := a.RegisterMetrics(m.reg); err != nil {
			panic(err)
		}
	}
	return m
}

// newApplyHistogram is the histogram RaftHooks.ObserveApply records into
// (made before the node, registered with its metrics).
func newApplyHistogram() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tokenserver_raft_apply_duration_seconds",
		Help:    "Time to commit and apply a Raft entry proposed by this node (rule writes, membership).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	})
}

// observeError counts an item answered with an error.
func (m *metrics) observeError(c codes.Code) { m.errors.WithLabelValues(c.String()).Inc() }

// handler serves /metrics.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

var (
	descDecisions   = prometheus.NewDesc("tokenserver_decisions_total", "Decisions made on this node, by rule and result (allowed, denied, shadow_denied: allowed by a shadow rule that would have denied).", []string{"rule", "result"}, nil)
	descBuckets     = prometheus.NewDesc("tokenserver_buckets", "Live buckets (rule, key pairs) on this node.", nil, nil)
	descEvicted     = prometheus.NewDesc("tokenserver_buckets_evicted_total", "Buckets dropped because they were back at their initial state or their rule is gone.", nil, nil)
	descCapDenied   = prometheus.NewDesc("tokenserver_bucket_cap_rejections_total", "New keys refused with RESOURCE_EXHAUSTED by --max-buckets, --max-bucket-memory (or a rule's fair share of it) or a rule's max_keys.", nil, nil)
	descBucketBytes = prometheus.NewDesc("tokenserver_bucket_memory_bytes", "Memory of the live buckets as counted against --max-bucket-memory (keys, index entries, algorithm state).", nil, nil)
	descBucketMax   = prometheus.NewDesc("tokenserver_bucket_memory_limit_bytes", "The bucket memory budget, --max-bucket-memory.", nil, nil)
	descRuleKeys    = prometheus.NewDesc("tokenserver_rule_keys", "Live buckets of a rule on this node.", []string{"rule"}, nil)
	descRuleVersion = prometheus.NewDesc("tokenserver_rule_version", "Version (Raft index) of the rule table applied on this node.", nil, nil)
	descRules       = prometheus.NewDesc("tokenserver_rules", "Rules in the table.", nil, nil)
	descEpoch       = prometheus.NewDesc("tokenserver_routing_epoch", "Epoch of the routing view.", nil, nil)
	descLive        = prometheus.NewDesc("tokenserver_routing_members", "Members in the routing view (nodes that own keys).", nil, nil)
	descReady       = prometheus.NewDesc("tokenserver_ready", "1 when /readyz passes.", nil, nil)
	descRaftState   = prometheus.NewDesc("tokenserver_raft_state", "1 for the node's current Raft state.", []string{"state"}, nil)
	descRaftLeader  = prometheus.NewDesc("tokenserver_raft_leader", "1 when this node leads.", nil, nil)
	descRaftTerm    = prometheus.NewDesc("tokenserver_raft_term", "Current Raft term.", nil, nil)
	descRaftCommit  = prometheus.NewDesc("tokenserver_raft_commit_index", "Raft commit index.", nil, nil)
	descRaftApplied = prometheus.NewDesc("tokenserver_raft_applied_index", "Raft index applied to the rule table.", nil, nil)
	descRaftContact = prometheus.NewDesc("tokenserver_raft_last_contact_seconds", "Seconds since a follower last heard from the leader (0 on the leader).", nil, nil)
	descConnRefused = prometheus.NewDesc("tokenserver_connections_refused_total", "Connections closed at accept because a cap was reached (--max-conns, --max-conns-per-ip and the HTTP ones), by port.", []string{"port"}, nil)
	descRaftMembers = prometheus.NewDesc("tokenserver_raft_members", "Servers in the Raft configuration, by suffrage.", []string{"suffrage"}, nil)
)

// nodeCollector reads the node's counters at scrape time, so the hot path
// only bumps atomics.
type nodeCollector struct{ n *Node }

// Describe implements prometheus.Collector.
func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDecisions, descBuckets, descEvicted, descCapDenied, descBucketBytes, descBucketMax, descRuleKeys, descRuleVersion, descRules,
		descEpoch, descLive, descReady, descRaftState, descRaftLeader, descRaftTerm, descRaftCommit, descRaftApplied, descRaftContact, descRaftMembers, descConnRefused} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	t := n.data.Table()
	for _, r := range t.Rules() {
		cr := t.Get(r.Name)
		d := n.decisions.counts(cr)
		ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(d.Allowed), r.Name, "allowed")
		ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(d.Denied), r.Name, "denied")
		ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(d.ShadowDenied), r.Name, "shadow_denied")
		ch <- prometheus.MustNewConstMetric(descRuleKeys, prometheus.GaugeValue, float64(n.buckets.KeyCount(cr)), r.Name)
	}
	ch <- prometheus.MustNewConstMetric(descBuckets, prometheus.GaugeValue, float64(n.buckets.Live()))
	ch <- prometheus.MustNewConstMetric(descEvicted, prometheus.CounterValue, float64(n.buckets.Evicted()))
	ch <- prometheus.MustNewConstMetric(descCapDenied, prometheus.CounterValue, float64(n.buckets.CapDenials()))
	ch <- prometheus.MustNewConstMetric(descBucketBytes, prometheus.GaugeValue, float64(n.buckets.Bytes()))
	ch <- prometheus.MustNewConstMetric(descBucketMax, prometheus.GaugeValue, float64(n.buckets.MaxBytes()))
	ch <- prometheus.MustNewConstMetric(descRuleVersion, prometheus.GaugeValue, float64(t.Version))
	ch <- prometheus.MustNewConstMetric(descRules, prometheus.GaugeValue, float64(t.Len()))
	v := n.data.View()
	ch <- prometheus.MustNewConstMetric(descEpoch, prometheus.GaugeValue, float64(v.Epoch))
	ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, float64(v.Len()))
	ready := 0.0
	if n.ready.Load() {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready)
	ch <- prometheus.MustNewConstMetric(descConnRefused, prometheus.CounterValue, float64(n.refusedGRPC.Load()), "grpc")
	ch <- prometheus.MustNewConstMetric(descConnRefused, prometheus.CounterValue, float64(n.refusedHTTP.Load()), "http")
	st, err := n.control.Status()
	if err != nil {
		return
	}
	for _, s := range []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown} {
		v := 0.0
		if s.String() == st.State {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descRaftState, prometheus.GaugeValue, v, s.String())
	}
	leader := 0.0
	if st.Leader == st.ID {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(descRaftLeader, prometheus.GaugeValue, leader)
	ch <- prometheus.MustNewConstMetric(descRaftTerm, prometheus.GaugeValue, float64(st.Term))
	ch <- prometheus.MustNewConstMetric(descRaftCommit, prometheus.GaugeValue, float64(st.CommitIndex))
	ch <- prometheus.MustNewConstMetric(descRaftApplied, prometheus.GaugeValue, float64(st.AppliedIndex))
	contact := 0.0
	if st.Leader != st.ID && !st.LastContact.IsZero() {
		contact = time.Since(st.LastContact).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(descRaftContact, prometheus.GaugeValue, contact)
	voters, nonvoters := 0, 0
	for _, m := range st.Members {
		if m.Voter {
			voters++
		} else {
			nonvoters++
		}
	}
	ch <- prometheus.MustNewConstMetric(descRaftMembers, prometheus.GaugeValue, float64(voters), "voter")
	ch <- prometheus.MustNewConstMetric(descRaftMembers, prometheus.GaugeValue, float64(nonvoters), "nonvoter")
}
