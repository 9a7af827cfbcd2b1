package xds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/tokenserver/tokenserver/internal/envoyrls"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// ErrRetry marks a callback error as transient (no leader, a Raft write that
// timed out): the client NACKs the set, then drops the stream and reconnects
// after a backoff, so that the server sends its current set again. Any other
// callback error is final for that version: the client NACKs it and waits
// for the next one, as for a set that fails to parse.
var ErrRetry = errors.New("xds: retry the set later")

// Callback receives each set of RateLimitConfig resources that converts,
// whole (state of the world: a domain absent from cfg is no longer served by
// xDS), with the server's version of it. It is called from Run's goroutine,
// one set at a time, with Run's context. A nil error ACKs the version; an
// error NACKs it with the error's text, and the client keeps reporting the
// last accepted version, so the configuration in force is the caller's last
// accepted one.
type Callback func(ctx context.Context, cfg *envoyrls.Config, version string) error

// Status is what the client last did, for logs and readiness.
type Status struct {
	// Accepted is the version of the last set the callback accepted, empty
	// before the first.
	Accepted string
	// Rejected and RejectReason are the last NACKed version and why; empty
	// when the last set received was accepted.
	Rejected     string
	RejectReason string
	// Connected is true while a stream to the server is open.
	Connected bool
}

// Client is an xDS state-of-the-world client over the aggregated discovery
// service. Run drives it; Status may be called from any goroutine.
type Client struct {
	cfg   Config
	apply Callback
	log   *slog.Logger
	node  *core.Node
	conn  *grpc.ClientConn

	mu     sync.Mutex
	status Status
}

// New builds a client for cfg (validated here) that hands each set to
// apply. It reads the TLS files and prepares the connection, but dials
// nothing until Run. log may be nil.
func New(cfg Config, apply Callback, log *slog.Logger) (*Client, error) {
	if !cfg.Enabled() {
		return nil, errors.New("xds: --envoy-xds-server is empty")
	}
	if apply == nil {
		return nil, errors.New("xds: nil callback")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("xds: %w", err)
	}
	md, err := cfg.metadata()
	if err != nil {
		return nil, fmt.Errorf("xds: %w", err)
	}
	creds, err := cfg.credentials()
	if err != nil {
		return nil, fmt.Errorf("xds: %w", err)
	}
	conn, err := grpc.NewClient(cfg.Server,
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: cfg.Backoff, MinConnectTimeout: 20 * time.Second /* gRPC's default */}),
	)
	if err != nil {
		return nil, fmt.Errorf("xds: client for %s: %w", cfg.Server, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{
		cfg:   cfg,
		apply: apply,
		log:   log.With("xds_server", cfg.Server, "xds_node_id", cfg.NodeID),
		node:  &core.Node{Id: cfg.NodeID, Metadata: md, UserAgentName: "tokenserver"},
		conn:  conn,
	}, nil
}

// Status returns a copy of the client's status.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

func (c *Client) setStatus(f func(*Status)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&c.status)
}

// Run subscribes to every RateLimitConfig (a wildcard subscription) and
// delivers each set to the callback until ctx ends, reconnecting with
// backoff whenever the stream ends. It returns nil when ctx ends, and
// closes the connection: a Client runs once.
func (c *Client) Run(ctx context.Context) error {
	defer c.conn.Close()
	ads := discovery.NewAggregatedDiscoveryServiceClient(c.conn)
	attempt := 0
	for {
		accepted, err := c.stream(ctx, ads)
		c.setStatus(func(s *Status) { s.Connected = false })
		if ctx.Err() != nil {
			return nil
		}
		if accepted {
			attempt = 0
		}
		wait := c.delay(attempt)
		attempt++
		c.log.Warn("xds stream ended; reconnecting", "err", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// delay is the backoff before reconnect attempt n (from 0), as gRPC's
// exponential backoff computes it.
func (c *Client) delay(n int) time.Duration {
	b := c.cfg.Backoff
	d := float64(b.BaseDelay) * math.Pow(b.Multiplier, float64(n))
	d = min(d, float64(b.MaxDelay))
	d *= 1 + b.Jitter*(rand.Float64()*2-1)
	return time.Duration(max(d, 0))
}

// stream runs one ADS stream until it fails, ctx ends, or the callback asks
// for a retry. progress reports whether a set was accepted on it: only then
// does the backoff start over, so a callback that keeps asking for a retry
// is retried ever more slowly.
func (c *Client) stream(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient) (progress bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// WaitForReady: while the server is down, wait for gRPC's own dialer
	// (paced by Config.Backoff) instead of failing at once.
	st, err := ads.StreamAggregatedResources(sctx, grpc.WaitForReady(true))
	if err != nil {
		return false, fmt.Errorf("open stream: %w", err)
	}
	accepted := c.Status().Accepted
	// A new stream starts with the version in force and no nonce: the
	// server sends its set unless that version is already its current one.
	if err := st.Send(c.request(accepted, "", nil)); err != nil {
		return false, fmt.Errorf("send subscription: %w", err)
	}
	c.setStatus(func(s *Status) { s.Connected = true })
	c.log.Info("xds stream open", "version", accepted)
	for {
		resp, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("server closed the stream")
			}
			return progress, fmt.Errorf("receive: %w", err)
		}
		if resp.GetTypeUrl() != TypeURL {
			// Only RateLimitConfig was asked for. Not answered: on ADS any
			// request for a type, even a NACK, would subscribe to it.
			c.log.Warn("xds response of an unexpected type ignored", "type_url", resp.GetTypeUrl())
			continue
		}
		version := resp.GetVersionInfo()
		err = c.deliver(ctx, resp)
		if err == nil {
			accepted, progress = version, true
			c.setStatus(func(s *Status) { s.Accepted, s.Rejected, s.RejectReason = version, "", "" })
			c.log.Info("xds set accepted", "version", version, "resources", len(resp.GetResources()))
			if err := st.Send(c.request(version, resp.GetNonce(), nil)); err != nil {
				return progress, fmt.Errorf("send ACK of version %q: %w", version, err)
			}
			continue
		}
		if ctx.Err() != nil {
			return progress, ctx.Err()
		}
		c.setStatus(func(s *Status) { s.Rejected, s.RejectReason = version, err.Error() })
		c.log.Error("xds set rejected; keeping the last accepted one", "version", version, "accepted", accepted, "err", err)
		nack := &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
		if errors.Is(err, ErrRetry) {
			nack.Code = int32(codes.Unavailable)
		}
		if err := st.Send(c.request(accepted, resp.GetNonce(), nack)); err != nil {
			return progress, fmt.Errorf("send NACK of version %q: %w", version, err)
		}
		if errors.Is(err, ErrRetry) {
			endStream(st, cancel)
			return progress, fmt.Errorf("version %q: %w", version, err)
		}
	}
}

// drainTimeout bounds how long endStream waits for the server to end a
// stream after the client half-closed it.
const drainTimeout = 5 * time.Second

// endStream half-closes st and waits for the server to end it (or for
// drainTimeout, then cancels it), so that the last request sent reaches the
// server: cancelling at once could reset the stream before it is read.
func endStream(st grpc.BidiStreamingClient[discovery.DiscoveryRequest, discovery.DiscoveryResponse], cancel context.CancelFunc) {
	_ = st.CloseSend()
	t := time.AfterFunc(drainTimeout, cancel)
	defer t.Stop()
	for {
		if _, err := st.Recv(); err != nil {
			return
		}
	}
}

// deliver converts a response and hands it to the callback.
func (c *Client) deliver(ctx context.Context, resp *discovery.DiscoveryResponse) error {
	cfg, err := Convert(resp.GetResources(), "xds:"+c.cfg.Server)
	if err != nil {
		return err
	}
	if err := c.apply(ctx, cfg, resp.GetVersionInfo()); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	return nil
}

// request is a DiscoveryRequest for every RateLimitConfig: version is the
// version in force, nonce the response it answers, nack the reason for a
// NACK or nil for an ACK.
func (c *Client) request(version, nonce string, nack *rpcstatus.Status) *discovery.DiscoveryRequest {
	return &discovery.DiscoveryRequest{
		Node:          c.node,
		TypeUrl:       TypeURL,
		VersionInfo:   version,
		ResponseNonce: nonce,
		ErrorDetail:   nack,
	}
}
