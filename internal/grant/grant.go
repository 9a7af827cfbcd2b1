// Package grant seals and opens grant ids with a hand-written SipHash-2-4,
// a keyed PRF made for short inputs, because the standard library has none
// and a generic MAC (HMAC-SHA256) would cost several times more per grant.
package grant

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
)

// Grant names one successful acquire so that RefillToken and RenewLease can
// find it again without the node storing every grant: it carries what the
// bucket needs (when it was made, how many permits it took, its lease id)
// and a tag over those and the (rule generation, bucket key) it belongs to,
// so a grant id cannot be forged, altered, or used for another key.
//
// The tag is SipHash-2-4, a keyed PRF made for short inputs, under a
// 128-bit key drawn from crypto/rand when the Keys are made; it never leaves
// the process, so a forged id passes with probability 2^-64 per try. The
// nonce and time travel offset by two more random 64-bit values of the
// process, so that an id shows neither the node's clock (its uptime) nor
// how many grants it made; what two ids of one key still show is the time
// and the grants between them, which their holder saw happen. The permits,
// which the caller knows, are in clear. (Masking them with SipHash of the
// tag instead would hide those differences too, at 35 ns more per grant,
// about 3% of a batched decision.) Grant ids die with the process, and
// with the key's move to another owner; a refill of such a grant changes
// nothing.
type Grant struct {
	// Nonce is unique among the bucket's grants; it is a concurrency
	// lease's id.
	Nonce uint64
	// IssuedAt is the node's monotonic time of the grant, in nanoseconds.
	IssuedAt int64
	// Permits is the number of permits granted.
	Permits int64
	// Sum is the tag.
	Sum uint64

	// mask offsets Nonce and IssuedAt in the encoded id (zero: in clear, as
	// Parse returns them until Keys.Open opens them).
	mask [2]uint64
}

// version is the first byte of an encoded grant id.
const version = 2

// rawLen is the length of a grant id before base64: version, nonce, time,
// permits, tag.
const rawLen = 1 + 8 + 8 + 8 + 8

// IDLen is the length of an encoded grant id (base64 of rawLen bytes,
// without padding).
const IDLen = (rawLen*8 + 5) / 6

// IsZero reports whether g names no grant.
func (g Grant) IsZero() bool { return g.Nonce == 0 && g.Sum == 0 }

// String encodes g as a grant id: URL-safe base64 without padding, "" for
// the zero Grant.
func (g Grant) String() string {
	if g.IsZero() {
		return ""
	}
	var buf [IDLen]byte
	return string(g.Append(buf[:0]))
}

// Append appends g's grant id (see String) to b, so that a batch can encode
// all its ids into one buffer.
func (g Grant) Append(b []byte) []byte {
	if g.IsZero() {
		return b
	}
	var raw [rawLen]byte
	raw[0] = version
	binary.BigEndian.PutUint64(raw[1:], g.Nonce+g.mask[0])
	binary.BigEndian.PutUint64(raw[9:], uint64(g.IssuedAt)+g.mask[1])
	binary.BigEndian.PutUint64(raw[17:], uint64(g.Permits))
	binary.BigEndian.PutUint64(raw[25:], g.Sum)
	return base64.RawURLEncoding.AppendEncode(b, raw[:])
}

// Parse decodes the envelope of a grant id made by Grant.String; its
// fields are still masked, and it is not yet verified against a rule and
// key (Keys.Open does both). The error says how s is malformed.
func Parse(s string) (Grant, error) {
	var raw [rawLen]byte
	if len(s) != IDLen {
		return Grant{}, fmt.Errorf("grant_id is malformed: %d characters, want %d", len(s), IDLen)
	}
	if strings.ContainsAny(s, "\r\n") { // the decoder would skip them
		return Grant{}, fmt.Errorf("grant_id %q is malformed: a line break", s)
	}
	if _, err := base64.RawURLEncoding.Decode(raw[:], []byte(s)); err != nil {
		return Grant{}, fmt.Errorf("grant_id %q is malformed: %w", s, err)
	}
	if raw[0] != version {
		return Grant{}, fmt.Errorf("grant_id %q is malformed: unknown version %d", s, raw[0])
	}
	return Grant{
		Nonce:    binary.BigEndian.Uint64(raw[1:]),
		IssuedAt: int64(binary.BigEndian.Uint64(raw[9:])),
		Permits:  int64(binary.BigEndian.Uint64(raw[17:])),
		Sum:      binary.BigEndian.Uint64(raw[25:]),
	}, nil
}

// Keys are the secrets of one issuer of grants (a node's bucket map): the
// SipHash key of the tag and the offsets of the nonce and the time. The
// zero value is not usable; make them with NewKeys. They are read-only
// once made, so safe for simultaneous use.
type Keys struct {
	tag  [2]uint64
	mask [2]uint64
}

// NewKeys draws fresh keys from crypto/rand. It panics when the system has
// no randomness, as crypto/rand itself does on current Go.
func NewKeys() Keys {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("grant: no randomness for grant keys: %v", err))
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	return Keys{tag: [2]uint64{u(0), u(1)}, mask: [2]uint64{u(2), u(3)}}
}

// Seal sets g's tag for the bucket key bk and rule generation gen, and its
// masks.
func (k *Keys) Seal(g *Grant, bk []byte, gen uint64) {
	g.Sum = k.tagOf(bk, gen, g)
	g.mask = k.mask
}

// Open unmasks a parsed grant and reports whether its tag matches bk and
// gen; a grant that does not match is not one of these Keys' for that key.
func (k *Keys) Open(g *Grant, bk []byte, gen uint64) bool {
	g.Nonce -= k.mask[0]
	g.IssuedAt -= int64(k.mask[1])
	return k.tagOf(bk, gen, g) == g.Sum && g.Nonce != 0 && g.Permits > 0
}

// tagOf is SipHash-2-4 under k.tag of gen, nonce, time and permits (each
// 8 bytes, little-endian) followed by bk: the four words go straight into
// the state, so nothing is copied.
func (k *Keys) tagOf(bk []byte, gen uint64, g *Grant) uint64 {
	v0, v1, v2, v3 := sipInit(k.tag[0], k.tag[1])
	for _, m := range [4]uint64{gen, g.Nonce, uint64(g.IssuedAt), uint64(g.Permits)} {
		v3 ^= m
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		v0 ^= m
	}
	return sipTail(v0, v1, v2, v3, bk, 32+len(bk))
}
