package shard

import (
	"encoding/base64"
	"encoding/binary"
	"hash/maphash"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// Grant names one successful acquire so that RefillToken and RenewLease can
// find it again without the node storing every grant: it carries what the
// bucket needs (when it was made, how many permits it took, its lease id)
// and a keyed hash over those and the (rule generation, key) it belongs to,
// so a grant id cannot be forged, altered, or used for another key.
//
// The hash is hash/maphash with a seed made at start: it is not a
// cryptographic MAC, but its seed never leaves the process, so guessing a
// valid id takes about 2^64 tries. Grant ids die with the process, and with
// the key's move to another owner; a refill of such a grant changes nothing.
type Grant struct {
	// Nonce is unique among the node's grants; it is a concurrency lease's id.
	Nonce uint64
	// IssuedAt is the node's monotonic time of the grant, in nanoseconds.
	IssuedAt int64
	// Permits is the number of permits granted.
	Permits int64
	// Sum is the keyed hash.
	Sum uint64
}

// grantVersion is the first byte of an encoded grant id.
const grantVersion = 1

// IsZero reports whether g names no grant.
func (g Grant) IsZero() bool { return g.Nonce == 0 }

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
var GrantIDLen = base64.RawURLEncoding.EncodedLen(33)

// Append appends g's grant id (see String) to b, so that a batch can encode
// all its ids into one buffer.
func (g Grant) Append(b []byte) []byte {
	if g.IsZero() {
		return b
	}
	var raw [1 + 8 + 8 + 8 + 8]byte
	raw[0] = grantVersion
	binary.BigEndian.PutUint64(raw[1:], g.Nonce)
	binary.BigEndian.PutUint64(raw[9:], uint64(g.IssuedAt))
	binary.BigEndian.PutUint64(raw[17:], uint64(g.Permits))
	binary.BigEndian.PutUint64(raw[25:], g.Sum)
	return base64.RawURLEncoding.AppendEncode(b, raw[:])
}

// ParseGrant decodes a grant id made by Grant.String; the result is not yet
// verified against a rule and key.
func ParseGrant(s string) (Grant, error) {
	var raw [1 + 8 + 8 + 8 + 8]byte
	if base64.RawURLEncoding.DecodedLen(len(s)) != len(raw) {
		return Grant{}, rule.Invalid("grant_id %q is malformed: wrong length", s)
	}
	if _, err := base64.RawURLEncoding.Decode(raw[:], []byte(s)); err != nil {
		return Grant{}, rule.Invalid("grant_id %q is malformed: %v", s, err)
	}
	if raw[0] != grantVersion {
		return Grant{}, rule.Invalid("grant_id %q is malformed: unknown version %d", s, raw[0])
	}
	g := Grant{
		Nonce:    binary.BigEndian.Uint64(raw[1:]),
		IssuedAt: int64(binary.BigEndian.Uint64(raw[9:])),
		Permits:  int64(binary.BigEndian.Uint64(raw[17:])),
		Sum:      binary.BigEndian.Uint64(raw[25:]),
	}
	if g.Nonce == 0 || g.Permits <= 0 {
		return Grant{}, rule.Invalid("grant_id %q is malformed: empty grant", s)
	}
	return g, nil
}

// sum computes the keyed hash of g for the bucket key bk (rule, key) and the
// rule generation: one maphash.Bytes call over the fields and bk.
func sum(seed maphash.Seed, bk []byte, gen uint64, g Grant) uint64 {
	var arr [32 + rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	b := binary.LittleEndian.AppendUint64(arr[:0], gen)
	b = binary.LittleEndian.AppendUint64(b, g.Nonce)
	b = binary.LittleEndian.AppendUint64(b, uint64(g.IssuedAt))
	b = binary.LittleEndian.AppendUint64(b, uint64(g.Permits))
	b = append(b, bk...)
	return maphash.Bytes(seed, b)
}
