package raftfsm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
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

// streamLayer is raft's transport stream layer on plain TCP that advertises
// a configured address (a DNS name in Kubernetes) rather than the listener's
// IP, which is all hashicorp/raft's TCPTransport can advertise. It also
// answers probes on the same port.
type streamLayer struct {
	ln        net.Listener
	advertise net.Addr
	probe     func() probeInfo
	dial      func(address string, timeout time.Duration) (net.Conn, error)
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu       sync.Mutex
	accepted map[*trackedConn]struct{} // open Raft connections, closed with the layer
}

// trackedConn is an accepted Raft connection that leaves the layer's set
// when closed, so that Close can end the ones still open (raft's handlers
// of incoming connections otherwise outlive the transport).
type trackedConn struct {
	net.Conn
	s    *streamLayer
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

var _ raft.StreamLayer = (*streamLayer)(nil)

// advertiseAddr is a net.Addr of a host:port string as given.
type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }

// newStreamLayer listens on bind and advertises advertise (bind when
// empty); dial, when not nil, replaces net.DialTimeout.
func newStreamLayer(bind, advertise string, probe func() probeInfo, dial func(string, time.Duration) (net.Conn, error)) (*streamLayer, error) {
	if dial == nil {
		dial = func(address string, timeout time.Duration) (net.Conn, error) {
			return net.DialTimeout("tcp", address, timeout)
		}
	}
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("listen raft %s: %w", bind, err)
	}
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	if _, _, err := net.SplitHostPort(advertise); err != nil {
		ln.Close()
		return nil, fmt.Errorf("advertise raft address %q: %w", advertise, err)
	}
	s := &streamLayer{ln: ln, advertise: advertiseAddr(advertise), probe: probe, dial: dial, conns: make(chan net.Conn), done: make(chan struct{})}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

func (s *streamLayer) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		s.wg.Add(1)
		go s.route(c)
	}
}

// route reads a connection's kind and hands Raft connections to Accept.
func (s *streamLayer) route(c net.Conn) {
	defer s.wg.Done()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var kind [1]byte
	if _, err := c.Read(kind[:]); err != nil {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	switch kind[0] {
	case connRaft:
		tc := &trackedConn{Conn: c, s: s}
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

// Dial opens a Raft connection to address.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := s.dial(string(address), timeout)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte{connRaft}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

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
