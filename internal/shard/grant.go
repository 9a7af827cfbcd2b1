package shard

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math/bits"
	"strings"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// Grant names one successful acquire so that RefillToken and RenewLease can
// find it again without the node storing every grant: it carries what the
// bucket needs (when it was made, how many permits it took, its lease id)
// and a tag over those and the (rule generation, key) it belongs to, so a
// grant id cannot be forged, altered, or used for another key.
//
// The tag is SipHash-2-4, a keyed PRF made for short inputs, under a
// 128-bit key drawn from crypto/rand when the Map is made; it never leaves
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
	// ParseGrant returns them until the Map opens them).
	mask [2]uint64
}

// grantVersion is the first byte of an encoded grant id.
const grantVersion = 2

// IsZero reports whether g names no grant.
func (g Grant) IsZero() bool { return g.Nonce == 0 && g.Sum == 0 }

// String encodes g as a grant id: URL-safe base64 without padding, "" for
// the zero Grant.
func (g Grant) String() string {
	if g.IsZero() {
		return ""
	}
	var buf [44]byte // GrantIDLen
	return string(g.Append(buf[:0]))
}

// GrantIDLen is the length of an encoded grant id.
var GrantIDLen = base64.RawURLEncoding.EncodedLen(grantRawLen)

const grantRawLen = 1 + 8 + 8 + 8 + 8

// Append appends g's grant id (see String) to b, so that a batch can encode
// all its ids into one buffer.
func (g Grant) Append(b []byte) []byte {
	if g.IsZero() {
		return b
	}
	var raw [grantRawLen]byte
	raw[0] = grantVersion
	binary.BigEndian.PutUint64(raw[1:], g.Nonce+g.mask[0])
	binary.BigEndian.PutUint64(raw[9:], uint64(g.IssuedAt)+g.mask[1])
	binary.BigEndian.PutUint64(raw[17:], uint64(g.Permits))
	binary.BigEndian.PutUint64(raw[25:], g.Sum)
	return base64.RawURLEncoding.AppendEncode(b, raw[:])
}

// ParseGrant decodes the envelope of a grant id made by Grant.String; its
// fields are still masked, and it is not yet verified against a rule and key
// (the Map that made it does both).
func ParseGrant(s string) (Grant, error) {
	var raw [grantRawLen]byte
	if len(s) != GrantIDLen {
		return Grant{}, rule.Invalid("grant_id is malformed: %d characters, want %d", len(s), GrantIDLen)
	}
	if strings.ContainsAny(s, "\r\n") { // the decoder would skip them
		return Grant{}, rule.Invalid("grant_id %q is malformed: a line break", s)
	}
	if _, err := base64.RawURLEncoding.Decode(raw[:], []byte(s)); err != nil {
		return Grant{}, rule.Invalid("grant_id %q is malformed: %v", s, err)
	}
	if raw[0] != grantVersion {
		return Grant{}, rule.Invalid("grant_id %q is malformed: unknown version %d", s, raw[0])
	}
	return Grant{
		Nonce:    binary.BigEndian.Uint64(raw[1:]),
		IssuedAt: int64(binary.BigEndian.Uint64(raw[9:])),
		Permits:  int64(binary.BigEndian.Uint64(raw[17:])),
		Sum:      binary.BigEndian.Uint64(raw[25:]),
	}, nil
}

// grantKeys are a Map's secrets: the SipHash key of the tag and the
// offsets of the nonce and the time.
type grantKeys struct {
	tag  [2]uint64
	mask [2]uint64
}

func newGrantKeys() grantKeys {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("shard: no randomness for grant keys: %v", err))
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	return grantKeys{tag: [2]uint64{u(0), u(1)}, mask: [2]uint64{u(2), u(3)}}
}

// seal sets g's tag for the bucket key bk and rule generation, and its
// masks.
func (k *grantKeys) seal(g *Grant, bk []byte, gen uint64) {
	g.Sum = k.tagOf(bk, gen, g)
	g.mask = k.mask
}

// open unmasks a parsed grant and reports whether its tag matches bk and
// gen; a grant that does not match is not one of this Map's for that key.
func (k *grantKeys) open(g *Grant, bk []byte, gen uint64) bool {
	g.Nonce -= k.mask[0]
	g.IssuedAt -= int64(k.mask[1])
	return k.tagOf(bk, gen, g) == g.Sum && g.Nonce != 0 && g.Permits > 0
}

func (k *grantKeys) tagOf(bk []byte, gen uint64, g *Grant) uint64 {
	var arr [32 + rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	b := binary.LittleEndian.AppendUint64(arr[:0], gen)
	b = binary.LittleEndian.AppendUint64(b, g.Nonce)
	b = binary.LittleEndian.AppendUint64(b, uint64(g.IssuedAt))
	b = binary.LittleEndian.AppendUint64(b, uint64(g.Permits))
	b = append(b, bk...)
	return siphash(k.tag[0], k.tag[1], b)
}

// sipRound is one SipRound (small enough for the compiler to inline).
func sipRound(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13)
	v1 ^= v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16)
	v3 ^= v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21)
	v3 ^= v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17)
	v1 ^= v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}

// siphash is SipHash-2-4 (Aumasson and Bernstein) of p under the key
// (k0, k1), as in the reference implementation.
func siphash(k0, k1 uint64, p []byte) uint64 {
	v0 := k0 ^ 0x736f6d6570736575
	v1 := k1 ^ 0x646f72616e646f6d
	v2 := k0 ^ 0x6c7967656e657261
	v3 := k1 ^ 0x7465646279746573
	n := len(p)
	for len(p) >= 8 {
		m := binary.LittleEndian.Uint64(p)
		v3 ^= m
		for range 2 {
			v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		}
		v0 ^= m
		p = p[8:]
	}
	var last [8]byte
	copy(last[:], p)
	last[7] = byte(n)
	m := binary.LittleEndian.Uint64(last[:])
	v3 ^= m
	for range 2 {
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	}
	v0 ^= m
	v2 ^= 0xff
	for range 4 {
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	}
	return v0 ^ v1 ^ v2 ^ v3
}
