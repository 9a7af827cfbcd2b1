package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/tokenserver/tokenserver/internal/envoyrls"
	"github.com/tokenserver/tokenserver/internal/envoyrls/xds"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
)

// EnvoyConfig configures Envoy's rate limit service (RLS v3) on a node:
// its sources of configuration and the shape of its answers. The zero
// value serves RLS with the domains written through the admin service.
type EnvoyConfig struct {
	// ConfigDir is --envoy-config-dir: envoyproxy/ratelimit's config
	// directory, watched; the leader writes its domains through Raft.
	ConfigDir string
	// PollInterval is how often ConfigDir is read (0: filewatch's default).
	PollInterval time.Duration
	// XDS is the --envoy-xds-* client (off when XDS.Server is empty); it
	// runs on the leader only.
	XDS xds.Config
	// Headers and HeaderNames are --envoy-rate-limit-headers and
	// --envoy-rate-limit-header-names.
	Headers     envoyrls.HeaderMode
	HeaderNames envoyrls.HeaderNames
	// NearLimitRatio is --envoy-near-limit-ratio (0: 0.8).
	NearLimitRatio float64
	// Shadow is --envoy-shadow-mode: every answer is OK.
	Shadow bool
	// DetailedMetricCap caps the descriptor values that become metric
	// labels per domain (0: 100).
	DetailedMetricCap int
}

// envoyStore is what the Envoy service needs of the cluster: the
// replicated domains (raftfsm.Node through RaftCluster).
type envoyStore interface {
	EnvoyDomains() raftfsm.EnvoyDomains
	EnvoyIndex() uint64
	PutEnvoyDomain(ctx context.Context, d raftfsm.EnvoyDomain, expected *uint64) (raftfsm.EnvoyDomain, error)
	DeleteEnvoyDomain(ctx context.Context, name string, expected *uint64) error
	SyncEnvoyDomains(ctx context.Context, origin string, ds []raftfsm.EnvoyDomain) (int, error)
	GetEnvoyDomain(ctx context.Context, name string) (raftfsm.EnvoyDomain, error)
	ListEnvoyDomains(ctx context.Context) (raftfsm.EnvoyDomains, error)
	IsLeader() bool
}

// envoyParsed is the parsed configuration as of one index of the store.
type envoyParsed struct {
	index uint64
	cfg   *envoyrls.Config
}

// envoy is a node's RLS: the service over the replicated configuration,
// the decider that counts on the owners' shards (envoy_decide.go), and the
// sources that write the configuration (envoy_sources.go).
type envoy struct {
	rlpb.UnimplementedRateLimitServiceServer
	n       *Node
	cfg     EnvoyConfig
	store   envoyStore // nil: a node without Raft serves no domains
	svc     *envoyrls.Service
	metrics *envoyrls.Metrics
	parsed  atomic.Pointer[envoyParsed]
	parseMu sync.Mutex
	dec     *envoyDecider

	// dirErr is why --envoy-config-dir does not load ("" when it does);
	// dirLoaded is set once it loaded, after which a bad directory keeps
	// the configuration in force and the node stays ready.
	dirMu     sync.Mutex
	dirErr    string
	dirLoaded bool
	dirCfg    *envoyrls.Config
	dirSynced *envoyrls.Config
	kick      chan struct{}
}

var _ rlpb.RateLimitServiceServer = (*envoy)(nil)

func newEnvoy(n *Node, cfg EnvoyConfig, control ControlPlane) (*envoy, error) {
	e := &envoy{n: n, cfg: cfg, kick: make(chan struct{}, 1)}
	if s, ok := control.(envoyStore); ok {
		e.store = s
	}
	labelCap := cfg.DetailedMetricCap
	if labelCap == 0 {
		labelCap = 100
	}
	m, err := envoyrls.NewMetrics(n.metrics.reg, labelCap)
	if err != nil {
		return nil, fmt.Errorf("envoy metrics: %w", err)
	}
	e.metrics = m
	e.dec = newEnvoyDecider(n)
	e.svc = envoyrls.NewService(e.config, e.dec, envoyrls.Options{
		Headers: cfg.Headers, HeaderNames: cfg.HeaderNames, NearLimitRatio: cfg.NearLimitRatio,
		GlobalShadow: cfg.Shadow, Metrics: m,
	})
	if cfg.ConfigDir != "" {
		e.dirErr = "--envoy-config-dir " + cfg.ConfigDir + " not loaded yet"
	}
	return e, nil
}

// config is the configuration in force: the store's domains, parsed once
// per change.
func (e *envoy) config() *envoyrls.Config {
	if e.store == nil {
		return nil
	}
	idx := e.store.EnvoyIndex()
	if p := e.parsed.Load(); p != nil && p.index == idx {
		return p.cfg
	}
	e.parseMu.Lock()
	defer e.parseMu.Unlock()
	if p := e.parsed.Load(); p != nil && p.index == idx {
		return p.cfg
	}
	st := e.store.EnvoyDomains()
	ds := make([]*envoyrls.Domain, 0, len(st.Domains))
	for _, d := range st.Domains {
		pd, err := envoyrls.ParseDomain(d.Source, []byte(d.YAML), envoyrls.Meta{Version: d.Version, Author: d.Author, Source: d.Source})
		if err != nil {
			// Validated where it entered the cluster: only a release that
			// validates more strictly gets here. Serve the others.
			e.n.log.Error("a replicated envoy domain does not parse here; not serving it", "domain", d.Name, "version", d.Version, "err", err)
			continue
		}
		ds = append(ds, pd)
	}
	cfg, err := envoyrls.NewConfig(ds...)
	if err != nil {
		e.n.log.Error("replicated envoy domains do not make a configuration", "err", err)
		cfg, _ = envoyrls.NewConfig()
	}
	e.parsed.Store(&envoyParsed{index: st.Index, cfg: cfg})
	return cfg
}

// ShouldRateLimit implements rlpb.RateLimitServiceServer. A call another
// node forwarded with envoyHitsHeader carries counter hits to decide here
// (envoy_decide.go); any other is Envoy's.
func (e *envoy) ShouldRateLimit(ctx context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
	if forwarded(ctx) && isHitBatch(ctx) {
		resp, err := e.dec.serveHits(ctx, req)
		if err != nil {
			return nil, toError(err)
		}
		return resp, nil
	}
	resp, err := e.svc.ShouldRateLimit(ctx, req)
	if err != nil {
		return nil, toError(envoyError(err))
	}
	return resp, nil
}

// envoyError gives envoyrls' errors their kinds: a refused request is
// InvalidArgument naming the field.
func envoyError(err error) error {
	var re *envoyrls.RequestError
	if errors.As(err, &re) {
		return failf(ErrBadRequest, "%s", re.Error())
	}
	var ce *envoyrls.ConfigError
	if errors.As(err, &ce) {
		return failf(ErrBadRequest, "%s", ce.Error())
	}
	return err
}

// jsonHandler is the /json endpoint on the HTTP port: ShouldRateLimit in
// proto3 JSON (envoyrls.NewJSONHandler), called through the node's unary
// interceptor with the HTTP request's credential (its Authorization
// header and TLS client certificate), so that /json refuses what gRPC
// refuses: a caller without the client role (401, 403 with the reason)
// and, on a node removed from the cluster, every call (400, the
// reference's status for a failed call, with the reason). Other failures
// are the reference's 400 "Bad Request".
func (e *envoy) jsonHandler() http.Handler {
	h := envoyrls.NewJSONHandler(e.shouldRateLimitJSON)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		md := metadata.MD{}
		if a := r.Header.Values("Authorization"); len(a) > 0 {
			md.Set("authorization", a...)
		}
		ctx := metadata.NewIncomingContext(r.Context(), md)
		p := &peer.Peer{Addr: httpAddr(r.RemoteAddr)}
		if r.TLS != nil {
			p.AuthInfo = credentials.TLSInfo{State: *r.TLS, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
		}
		h.ServeHTTP(w, r.WithContext(peer.NewContext(ctx, p)))
	})
}

// httpAddr is an HTTP caller's remote address as a peer's.
type httpAddr string

func (a httpAddr) Network() string { return "tcp" }
func (a httpAddr) String() string  { return string(a) }

// shouldRateLimitJSON is the /json endpoint's call (jsonHandler).
func (e *envoy) shouldRateLimitJSON(ctx context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
	out, err := e.n.unary(ctx, req, &grpc.UnaryServerInfo{FullMethod: rlpb.RateLimitService_ShouldRateLimit_FullMethodName},
		func(ctx context.Context, req any) (any, error) {
			return e.svc.ShouldRateLimit(ctx, req.(*rlpb.RateLimitRequest))
		})
	if err == nil {
		return out.(*rlpb.RateLimitResponse), nil
	}
	switch st := toStatus(err); st.Code() {
	case codes.Unauthenticated:
		return nil, &envoyrls.HTTPError{Code: http.StatusUnauthorized, Msg: st.Message()}
	case codes.PermissionDenied:
		return nil, &envoyrls.HTTPError{Code: http.StatusForbidden, Msg: st.Message()}
	case codes.FailedPrecondition:
		return nil, &envoyrls.HTTPError{Code: http.StatusBadRequest, Msg: st.Message()}
	}
	return nil, err
}

// notReady is why the Envoy side keeps the node from being ready, "" when
// it does not: a --envoy-config-dir that never loaded.
func (e *envoy) notReady() string {
	if e == nil {
		return ""
	}
	e.dirMu.Lock()
	defer e.dirMu.Unlock()
	if e.dirLoaded {
		return ""
	}
	return e.dirErr
}

// envoyVersion is the Version of the rule.Compiled values of Envoy
// counters: above any Raft index, so that the rules' Sweep never takes
// them for buckets of a deleted rule.
const envoyVersion = 1 << 62

// clampU32 is v as a uint32, saturated.
func clampU32(v int64) uint32 {
	switch {
	case v <= 0:
		return 0
	case v > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(v)
}
