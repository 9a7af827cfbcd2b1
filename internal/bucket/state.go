package bucket

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// stateVersion is the first byte of MarshalState's encoding.
const stateVersion = 1

// ErrBadState is wrapped by UnmarshalState's errors.
var ErrBadState = errors.New("bad bucket state")

// MarshalState encodes b, judged by c, as of now, so that another process
// can carry on with it (UnmarshalState): the state first advances to now
// (a peek), then every time in it is written relative to now, since each
// process has its own monotonic clock. The encoding is compact binary
// (varints), made for bulk transfer between nodes of one release.
func MarshalState(c *Config, b Bucket, now int64) ([]byte, error) {
	b.Acquire(c, now, Request{}) // advance windows and logs to now
	// Room for the fixed-size states (a token bucket takes up to 30
	// bytes), so that most encodings take one allocation.
	out := append(make([]byte, 0, 32), stateVersion, byte(c.Algorithm))
	rel := func(t int64) int64 { return addSat(t, -now) }
	switch s := b.(type) {
	case *tokenBucket:
		out = binary.BigEndian.AppendUint64(out, math.Float64bits(s.tokens))
		out = binary.AppendVarint(out, rel(s.last))
		out = binary.AppendVarint(out, rel(s.next))
	case *leakyBucket:
		out = binary.AppendVarint(out, rel(s.next))
		out = binary.AppendVarint(out, rel(s.last))
	case *fixedWindow:
		// The window is implicit: the count belongs to the window of the
		// receiver's now. See UnmarshalState.
		out = binary.AppendVarint(out, s.count)
	case *slidingWindow:
		k := int64(len(s.counts))
		out = binary.AppendVarint(out, s.debt)
		out = binary.AppendVarint(out, k)
		head := floorDiv(s.last, c.Period/max(1, c.Samples()))
		for i := int64(0); i < k; i++ { // oldest sub-window first
			out = binary.AppendVarint(out, s.counts[floorMod(head-k+1+i, k)])
		}
	case *slidingLog:
		out = binary.AppendVarint(out, rel(s.last))
		out = binary.AppendUvarint(out, uint64(s.size))
		for i := 0; i < s.size; i++ {
			e := s.at(i)
			out = binary.AppendVarint(out, rel(e.t))
			out = binary.AppendVarint(out, e.count)
		}
	case *concurrency:
		out = binary.AppendVarint(out, rel(s.last))
		out = binary.AppendUvarint(out, uint64(len(s.leases)))
		for _, l := range s.leases {
			out = binary.AppendUvarint(out, l.id)
			out = binary.AppendVarint(out, l.permits)
			out = binary.AppendVarint(out, rel(l.expires))
		}
	default:
		return nil, fmt.Errorf("marshal bucket state: unknown bucket type %T", b)
	}
	return out, nil
}

// UnmarshalState decodes a MarshalState encoding into a bucket judged by
// c, placing its times relative to now (the receiver's clock). The
// algorithm must be c's. A fixed window's count lands in the window of
// now and a sliding window's ring is aligned to now's sub-window: where
// the two clocks' windows are not aligned, the count is kept until the
// receiver's boundary, which is later or, at worst, one window earlier
// (the boundary burst fixed windows already allow).
func UnmarshalState(c *Config, data []byte, now int64) (Bucket, error) {
	d := stateDecoder{buf: data}
	if len(data) < 2 || data[0] != stateVersion {
		return nil, fmt.Errorf("%w: unknown version", ErrBadState)
	}
	if Algorithm(data[1]) != c.Algorithm {
		return nil, fmt.Errorf("%w: state of %s, rule is %s", ErrBadState, Algorithm(data[1]), c.Algorithm)
	}
	d.buf = data[2:]
	abs := func(r int64) int64 { return addSat(now, r) }
	var b Bucket
	switch c.Algorithm {
	case TokenBucket:
		s := newTokenBucket(c, now)
		tokens := math.Float64frombits(d.u64())
		if math.IsNaN(tokens) || math.IsInf(tokens, 0) {
			return nil, fmt.Errorf("%w: tokens %v", ErrBadState, tokens)
		}
		s.tokens = min(tokens, s.tokens) // never more than a full bucket
		s.last = min(abs(d.varint()), now)
		s.next = abs(d.varint())
		b = s
	case LeakyBucket:
		s := newLeakyBucket(c, now)
		s.next = abs(d.varint())
		s.last = min(abs(d.varint()), now)
		b = s
	case FixedWindow:
		s := newFixedWindow(c, now)
		s.count = d.varint()
		b = s
	case SlidingWindow:
		s := newSlidingWindow(c, now)
		s.debt = max(0, d.varint())
		k := d.varint()
		if k != int64(len(s.counts)) {
			return nil, fmt.Errorf("%w: %d sub-windows, rule has %d", ErrBadState, k, len(s.counts))
		}
		head := floorDiv(now, c.Period/k)
		for i := int64(0); i < k && d.err == nil; i++ {
			v := max(0, d.varint())
			s.counts[floorMod(head-k+1+i, k)] = v
			s.total = addSat(s.total, v)
		}
		b = s
	case SlidingLog:
		s := newSlidingLog(c, now)
		s.last = min(abs(d.varint()), now)
		n := d.uvarint()
		if n > MaxLogLimit {
			return nil, fmt.Errorf("%w: %d log entries", ErrBadState, n)
		}
		for i := uint64(0); i < n && d.err == nil; i++ {
			t, n := min(abs(d.varint()), now), max(0, d.varint())
			if s.size > 0 && t < s.at(s.size-1).t {
				return nil, fmt.Errorf("%w: log out of order", ErrBadState)
			}
			if n > 0 {
				s.push(c, t, n)
			}
		}
		b = s
	case Concurrency:
		s := newConcurrency(c, now)
		s.last = min(abs(d.varint()), now)
		n := d.uvarint()
		if n > MaxConcurrencyLimit {
			return nil, fmt.Errorf("%w: %d leases", ErrBadState, n)
		}
		for i := uint64(0); i < n && d.err == nil; i++ {
			l := lease{id: d.uvarint(), permits: max(0, d.varint()), expires: abs(d.varint())}
			s.leases = append(s.leases, l)
			s.total = addSat(s.total, l.permits)
		}
		b = s
	default:
		return nil, fmt.Errorf("%w: unknown algorithm %d", ErrBadState, c.Algorithm)
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.buf) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrBadState, len(d.buf))
	}
	return b, nil
}

// stateDecoder reads varints, keeping the first error.
type stateDecoder struct {
	buf []byte
	err error
}

func (d *stateDecoder) varint() int64 {
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *stateDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *stateDecoder) u64() uint64 {
	if len(d.buf) < 8 {
		d.fail()
		return 0
	}
	v := binary.BigEndian.Uint64(d.buf)
	d.buf = d.buf[8:]
	return v
}

func (d *stateDecoder) fail() {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated", ErrBadState)
	}
	d.buf = nil
}
