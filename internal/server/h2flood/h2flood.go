// Package h2flood sends hostile HTTP/2 frame sequences to a gRPC server,
// for the bounded attack tests of the node's limits (rapid reset, huge
// header blocks) that no well-behaved gRPC client can send.
//
// It is written on golang.org/x/net/http2's Framer and hpack encoder
// because grpc-go's own client checks the limits it is meant to cross.
package h2flood

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Conn is one plain-text HTTP/2 connection to a gRPC server. Its writes
// are not safe for simultaneous use; a goroutine reads (and discards) what
// the server sends, acking its settings and pings.
type Conn struct {
	c    net.Conn
	fr   *http2.Framer
	wmu  sync.Mutex
	next uint32
	buf  bytes.Buffer
	enc  *hpack.Encoder
	// GoAway is set once the server sent GOAWAY; Resets counts the
	// RST_STREAM frames it sent; Closed is closed when the read side ends.
	GoAway atomic.Bool
	Resets atomic.Int64
	Closed chan struct{}
	pongs  chan [8]byte
}

// Dial connects to addr and sends the client preface and settings.
func Dial(addr string) (*Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	cn := &Conn{c: c, fr: http2.NewFramer(c, c), next: 1, Closed: make(chan struct{}), pongs: make(chan [8]byte, 16)}
	cn.enc = hpack.NewEncoder(&cn.buf)
	cn.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		c.Close()
		return nil, fmt.Errorf("preface: %w", err)
	}
	if err := cn.fr.WriteSettings(); err != nil {
		c.Close()
		return nil, fmt.Errorf("settings: %w", err)
	}
	go cn.read()
	return cn, nil
}

// Close closes the connection.
func (cn *Conn) Close() error { return cn.c.Close() }

func (cn *Conn) read() {
	defer close(cn.Closed)
	for {
		f, err := cn.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				cn.wmu.Lock()
				_ = cn.fr.WriteSettingsAck()
				cn.wmu.Unlock()
			}
		case *http2.PingFrame:
			if f.IsAck() {
				select {
				case cn.pongs <- f.Data:
				default:
				}
				continue
			}
			cn.wmu.Lock()
			_ = cn.fr.WritePing(true, f.Data)
			cn.wmu.Unlock()
		case *http2.GoAwayFrame:
			cn.GoAway.Store(true)
		case *http2.RSTStreamFrame:
			cn.Resets.Add(1)
		}
	}
}

// Headers opens a stream calling the gRPC method path (a full method
// name) with the extra header pairs, and returns its id. A header block
// larger than one frame goes in CONTINUATION frames. The stream stays
// open (no body is sent).
func (cn *Conn) Headers(path string, extra ...string) (uint32, error) {
	cn.buf.Reset()
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path},
		{Name: ":authority", Value: "localhost"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	} {
		if err := cn.enc.WriteField(f); err != nil {
			return 0, err
		}
	}
	for i := 0; i+1 < len(extra); i += 2 {
		if err := cn.enc.WriteField(hpack.HeaderField{Name: extra[i], Value: extra[i+1], Sensitive: true}); err != nil {
			return 0, err
		}
	}
	id := cn.next
	cn.next += 2
	block := cn.buf.Bytes()
	const maxFrame = 16 << 10
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	first := block[:min(len(block), maxFrame)]
	if err := cn.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(block) <= maxFrame}); err != nil {
		return 0, fmt.Errorf("headers: %w", err)
	}
	for rest := block[len(first):]; len(rest) > 0; {
		n := min(len(rest), maxFrame)
		if err := cn.fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
			return 0, fmt.Errorf("continuation: %w", err)
		}
		rest = rest[n:]
	}
	return id, nil
}

// Sync sends a PING and waits for its ack, up to timeout: the server reads
// a connection's frames in order, so once it acks, it has read every
// frame sent before. False when no ack came (or the connection closed).
func (cn *Conn) Sync(timeout time.Duration) bool {
	data := [8]byte{'h', '2', 'f', 'l', 'o', 'o', 'd', '!'}
	cn.wmu.Lock()
	err := cn.fr.WritePing(false, data)
	cn.wmu.Unlock()
	if err != nil {
		return false
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case d := <-cn.pongs:
			if d == data {
				return true
			}
		case <-cn.Closed:
			return false
		case <-t.C:
			return false
		}
	}
}

// Reset cancels stream id (RST_STREAM CANCEL).
func (cn *Conn) Reset(id uint32) error {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	return cn.fr.WriteRSTStream(id, http2.ErrCodeCancel)
}

// RapidReset opens and at once cancels up to n streams calling path,
// stopping at the deadline, when the server goes away or a write fails
// (the server closed the connection). It returns how many it sent.
func (cn *Conn) RapidReset(path string, n int, deadline time.Time) (int, error) {
	for i := range n {
		if cn.GoAway.Load() || time.Now().After(deadline) {
			return i, nil
		}
		id, err := cn.Headers(path)
		if err == nil {
			err = cn.Reset(id)
		}
		if err != nil {
			return i, err
		}
	}
	return n, nil
}
