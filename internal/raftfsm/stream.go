package raftfsm

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/netutil"
)

// Connection kinds: the first byte a dialer writes on the Raft port.
const (
	connRaft  byte = 'R'
	connProbe byte = 'P'
)

// probeInfo is a node's answer to a probe on its Raft port: who it is and
// whether it already has Raft state. --bootstrap-expect uses it to decide
// between bootstrapping a new cluster and joining an existing one.
type probeInfo struct {
	ID       string `json:"id"`
	GRPCAddr string `json:"grpc_addr"`
	HasState bool   `json:"has_state"`
	Leader   string `json:"leader,omitempty"`
	// Term and CommitIndex are the node's Raft term and commit index; a
	// restarting follower learns the commit index to catch up to from
	// its leader's.
	Term        uint64 `json:"term,omitempty"`
	CommitIndex uint64 `json:"commit_index,omitempty"`
}

// Defaults of the stream layer's limits.
const (
	// defaultHandshakeTimeout bounds the TLS handshake and the kind byte of
	// an accepted connection: a dialer that says nothing is dropped.
	defaultHandshakeTimeout = 5 * time.Second
	// defaultIdleTimeout closes an accepted Raft connection that carried
	// nothing for this long (a leader's heartbeats keep its connections
	// busy every ~100 ms; its dialer redials when a pooled one was closed).
	defaultIdleTimeout = 2 * time.Minute
	// defaultMaxConnsPerHost caps the open and handshaking connections from
	// one remote IP (raft gives each accepted connection a 256 KiB
	// buffer). Peers use a handful each; tests run several on 127.0.0.1.
	defaultMaxConnsPerHost = 64
	// defaultMaxConns caps all of them.
	defaultMaxConns = 1024
)

// streamOptions configures newStreamLayerWith. Zero limits take the
// defaults; negative ones turn the limit off.
type streamOptions struct {
	// Bind is the listen address; Advertise the address others dial
	// (Bind's when empty).
	Bind, Advertise string
	// Listener, when set, is the listener to serve (Bind is then unused):
	// one bound by the caller, so that no other process can take the
	// port between choosing it and binding it.
	Listener net.Listener
	// Logger receives accept errors (slog.Default when nil).
	Logger *slog.Logger
	// Probe answers probes.
	Probe func() probeInfo
	// Dial, when set, replaces netutil.DialTimeout (TLS, when on, runs
	// over it).
	Dial func(address string, timeout time.Duration) (net.Conn, error)
	// ServerTLS and ClientTLS, both or neither, make every accepted and
	// dialed connection (Raft and probes) mutual TLS: typically
	// tlsutil.Reloader's PeerServerConfig and PeerClientConfig. A dialer
	// without a peer certificate is refused before one byte past the
	// handshake is read.
	ServerTLS, ClientTLS *tls.Config
	// HandshakeTimeout bounds an accepted connection's TLS handshake and
	// kind byte.
	HandshakeTimeout time.Duration
	// IdleTimeout closes accepted Raft connections idle for this long.
	IdleTimeout time.Duration
	// MaxConnsPerHost and MaxConns cap accepted connections by remote IP
	// and in all; a connection past a cap is closed at once.
	MaxConnsPerHost, MaxConns int
}

// streamLayer is raft's transport stream layer on TCP (or mutual TLS) that
// advertises a configured address (a DNS name in Kubernetes) rather than
// the listener's IP, which is all hashicorp/raft's TCPTransport can
// advertise. It also answers probes on the same port, caps connections per
// remote IP and closes idle ones.
type streamLayer struct {
	ln        net.Listener
	advertise net.Addr
	probe     func() probeInfo
	// dial dials a peer, TLS included: Dial and probe use it.
	dial      func(address string, timeout time.Duration) (net.Conn, error)
	o         streamOptions
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	// dialsEnd is closed when the node shuts down: Dial stops waiting for
	// an address to take its connection (raft's shutdown waits for the
	// goroutines that dial).
	dialsEnd  chan struct{}
	dialsOnce sync.Once
	wg        sync.WaitGroup

	mu       sync.Mutex
	accepted map[*trackedConn]struct{} // open Raft connections, closed with the layer
	dialed   map[*dialedConn]struct{}  // open connections Dial made (abortConns)
	perHost  map[string]int            // open connections by remote IP
	total    int
	refused  uint64 // connections closed at a cap
}

// trackedConn is an accepted Raft connection that leaves the layer's set
// when closed, so that Close can end the ones still open (raft's handlers
// of incoming connections otherwise outlive the transport). It ends the
// connection after IdleTimeout without traffic.
type trackedConn struct {
	net.Conn
	s    *streamLayer
	idle time.Duration
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.accepted, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// Read reads with the idle deadline; an idle connection ends as at EOF
// (raft then closes it without logging an error).
func (c *trackedConn) Read(p []byte) (int, error) {
	if c.idle > 0 {
		_ = c.Conn.SetReadDeadline(time.Now().Add(c.idle))
	}
	n, err := c.Conn.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return n, io.EOF
	}
	return n, err
}

// Write writes with the idle deadline, so a peer that stops reading cannot
// hold the connection.
func (c *trackedConn) Write(p []byte) (int, error) {
	if c.idle > 0 {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(c.idle))
	}
	return c.Conn.Write(p)
}

// dialedConn is a connection Dial made, in the layer's set until closed,
// so that abortConns can end it.
type dialedConn struct {
	net.Conn
	s    *streamLayer
	once sync.Once
}

func (c *dialedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.dialed, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// abortConns closes every open Raft connection, dialed and accepted: a
// write blocked on a peer that no longer reads (frozen, or behind a
// partition) fails at once, so that raft's shutdown, which waits for its
// replication goroutines, can end.
func (s *streamLayer) abortConns() {
	s.mu.Lock()
	open := make([]net.Conn, 0, len(s.dialed)+len(s.accepted))
	for c := range s.dialed {
		open = append(open, c)
	}
	for c := range s.accepted {
		open = append(open, c)
	}
	s.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

// countedConn holds a slot of the connection caps until closed.
type countedConn struct {
	net.Conn
	s    *streamLayer
	host string
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.s.release(c.host) })
	return c.Conn.Close()
}

var _ raft.StreamLayer = (*streamLayer)(nil)

// advertiseAddr is a net.Addr of a host:port string as given.
type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }

// newStreamLayerWith starts a stream layer configured by o.
func newStreamLayerWith(o streamOptions) (*streamLayer, error) {
	if (o.ServerTLS == nil) != (o.ClientTLS == nil) {
		return nil, errors.New("raft stream layer: server and client TLS configs go together")
	}
	o.HandshakeTimeout = orDefault(o.HandshakeTimeout, defaultHandshakeTimeout)
	o.IdleTimeout = orDefault(o.IdleTimeout, defaultIdleTimeout)
	o.MaxConnsPerHost = orDefault(o.MaxConnsPerHost, defaultMaxConnsPerHost)
	o.MaxConns = orDefault(o.MaxConns, defaultMaxConns)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	// Keepalive and TCP_USER_TIMEOUT on both ends: a peer dropped by a
	// partition fails its connections within seconds, and raft redials
	// at the heal instead of waiting out TCP's retransmission backoff.
	raw := o.Dial
	if raw == nil {
		raw = func(address string, timeout time.Duration) (net.Conn, error) {
			return netutil.DialTimeout(netutil.DefaultOptions(), address, timeout)
		}
	}
	ln := o.Listener
	if ln == nil {
		var err error
		if ln, err = netutil.Listen(netutil.DefaultOptions(), o.Bind); err != nil {
			return nil, fmt.Errorf("listen raft: %w", err)
		}
	}
	advertise := o.Advertise
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	if _, _, err := net.SplitHostPort(advertise); err != nil {
		ln.Close()
		return nil, fmt.Errorf("advertise raft address %q: %w", advertise, err)
	}
	s := &streamLayer{ln: ln, advertise: advertiseAddr(advertise), probe: o.Probe, o: o,
		conns: make(chan net.Conn), done: make(chan struct{}), dialsEnd: make(chan struct{}), perHost: map[string]int{}}
	s.dial = raw
	if o.ClientTLS != nil {
		s.dial = func(address string, timeout time.Duration) (net.Conn, error) {
			return dialTLS(raw, o.ClientTLS, address, timeout)
		}
	}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// dialTLS dials address and completes a TLS handshake within timeout.
func dialTLS(raw func(string, time.Duration) (net.Conn, error), cfg *tls.Config, address string, timeout time.Duration) (net.Conn, error) {
	start := time.Now()
	c, err := raw(address, timeout)
	if err != nil {
		return nil, err
	}
	if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
		cfg = cfg.Clone()
		cfg.ServerName, _, _ = net.SplitHostPort(address)
	}
	tc := tls.Client(c, cfg)
	if timeout > 0 {
		_ = tc.SetDeadline(start.Add(timeout))
	}
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, fmt.Errorf("raft tls handshake with %s: %w", address, err)
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

// admit takes a slot of the caps for a connection from host.
func (s *streamLayer) admit(host string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if (s.o.MaxConns > 0 && s.total >= s.o.MaxConns) || (s.o.MaxConnsPerHost > 0 && s.perHost[host] >= s.o.MaxConnsPerHost) {
		s.refused++
		return false
	}
	s.total++
	s.perHost[host]++
	return true
}

func (s *streamLayer) release(host string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.perHost[host]--; s.perHost[host] <= 0 {
		delete(s.perHost, host)
	}
}

// Accept retry backoff, as net/http's Server.Serve: from
// acceptBackoffMin doubling up to acceptBackoffMax while Accept fails.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// acceptLoop accepts until the layer closes. An accept error (EMFILE when
// the process is out of file descriptors, ECONNABORTED, ...) is logged and
// retried with backoff, never the end of the loop: a Raft port that stops
// accepting cuts the node off for good.
func (s *streamLayer) acceptLoop() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				s.o.Logger.Error("raft listener closed under the node: the raft port no longer accepts", "err", err)
				return
			}
			delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
			s.o.Logger.Warn("raft accept failed: retrying", "err", err, "retry_in", delay.String())
			t := time.NewTimer(delay)
			select {
			case <-s.done:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		delay = 0
		host := c.RemoteAddr().String()
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !s.admit(host) {
			c.Close()
			continue
		}
		s.wg.Add(1)
		go s.route(&countedConn{Conn: c, s: s, host: host})
	}
}

// route completes the TLS handshake, if any, reads a connection's kind and
// hands Raft connections to Accept. Nothing past the handshake is read
// from a dialer without a peer certificate.
func (s *streamLayer) route(c net.Conn) {
	defer s.wg.Done()
	_ = c.SetDeadline(time.Now().Add(s.o.HandshakeTimeout))
	if s.o.ServerTLS != nil {
		tc := tls.Server(c, s.o.ServerTLS)
		if err := tc.Handshake(); err != nil {
			c.Close()
			return
		}
		c = tc
	}
	var kind [1]byte
	if _, err := io.ReadFull(c, kind[:]); err != nil {
		c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	switch kind[0] {
	case connRaft:
		tc := &trackedConn{Conn: c, s: s, idle: max(s.o.IdleTimeout, 0)}
		s.mu.Lock()
		if s.accepted == nil {
			s.accepted = map[*trackedConn]struct{}{}
		}
		s.accepted[tc] = struct{}{}
		s.mu.Unlock()
		select {
		case s.conns <- tc:
		case <-s.done:
			tc.Close()
		}
	case connProbe:
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_ = json.NewEncoder(c).Encode(s.probe())
		c.Close()
	default:
		c.Close()
	}
}

// Accept returns the next Raft connection.
func (s *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting.
func (s *streamLayer) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		s.ln.Close()
		s.mu.Lock()
		open := make([]*trackedConn, 0, len(s.accepted))
		for c := range s.accepted {
			open = append(open, c)
		}
		s.mu.Unlock()
		for _, c := range open {
			c.Close()
		}
	})
	return nil
}

// Addr is the advertised address.
func (s *streamLayer) Addr() net.Addr { return s.advertise }

// redialFor is how long Dial keeps trying an address that does not take
// the connection before it reports the failure to raft, trying every
// redialEvery. raft's leader backs off exponentially per failed call to a
// follower, up to 10.24 s (constants of hashicorp/raft), so a follower back
// after an outage of a minute or more used to wait up to that long for its
// log, and so for the routing view. A Dial that waits instead costs raft one
// failure a minute, and connects within redialEvery of the node's return.
// raft runs every call to a peer on that peer's own goroutines, so a waiting
// Dial delays nothing else.
const (
	redialFor   = time.Minute
	redialEvery = 100 * time.Millisecond
)

// Dial opens a Raft connection to address, waiting up to redialFor for it
// to take one.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	giveUp := time.Now().Add(redialFor)
	for {
		select {
		case <-s.dialsEnd: // shutting down: a new connection would only hold it up
			return nil, net.ErrClosed
		default:
		}
		c, err := s.dial(string(address), timeout)
		if err == nil {
			if _, err := c.Write([]byte{connRaft}); err != nil {
				c.Close()
				return nil, err
			}
			dc := &dialedConn{Conn: c, s: s}
			s.mu.Lock()
			if s.dialed == nil {
				s.dialed = map[*dialedConn]struct{}{}
			}
			s.dialed[dc] = struct{}{}
			s.mu.Unlock()
			return dc, nil
		}
		if !unanswered(err) || time.Now().After(giveUp) {
			return nil, err
		}
		select {
		case <-s.done:
			return nil, err
		case <-s.dialsEnd:
			return nil, err
		case <-time.After(redialEvery):
		}
	}
}

// unanswered reports whether a dial failed because nothing took the
// connection (refused, reset, unreachable, timed out, a name that does not
// resolve yet): worth waiting for. A refused TLS handshake is not.
func unanswered(err error) bool {
	var dnsErr *net.DNSError
	var ne net.Error
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.As(err, &dnsErr) || (errors.As(err, &ne) && ne.Timeout())
}

// endDials makes Dial give up at once from now on, and dial no more.
func (s *streamLayer) endDials() { s.dialsOnce.Do(func() { close(s.dialsEnd) }) }

// probe asks the node at a Raft address who it is.
func probe(dial func(string, time.Duration) (net.Conn, error), address string, timeout time.Duration) (probeInfo, error) {
	c, err := dial(address, timeout)
	if err != nil {
		return probeInfo{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{connProbe}); err != nil {
		return probeInfo{}, err
	}
	var p probeInfo
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&p); err != nil {
		return probeInfo{}, fmt.Errorf("probe %s: %w", address, err)
	}
	return p, nil
}
