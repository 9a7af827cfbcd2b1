package shard

import (
	"encoding/base64"
	"encoding/binary"
	"testing"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// TestSipHashVectors checks siphash against the reference implementation's
// vectors (key 00..0f, message 00..len-1).
func TestSipHashVectors(t *testing.T) {
	k0, k1 := uint64(0x0706050403020100), uint64(0x0f0e0d0c0b0a0908)
	msg := make([]byte, 64)
	for i := range msg {
		msg[i] = byte(i)
	}
	for _, tc := range []struct {
		n    int
		want uint64
	}{
		{0, 0x726fdb47dd0e0e31},
		{1, 0x74f839c593dc67fd},
		{7, 0xab0200f58b01d137},
		{8, 0x93f5f5799a932462},
		{15, 0xa129ca6149be45e5},
		{63, 0x958a324ceb064572},
	} {
		if got := siphash(k0, k1, msg[:tc.n]); got != tc.want {
			t.Errorf("siphash(%d bytes) = %#x, want %#x", tc.n, got, tc.want)
		}
	}
}

// TestGrantIDs: ids refill only for their own key, rule generation and
// Map; any flipped bit is refused; and the id shows neither the node's
// clock nor the nonce in clear.
func TestGrantIDs(t *testing.T) {
	_, get := store(t, tb("api", 10), tb("other", 10))
	m, m2 := New(Config{}), New(Config{})
	now := int64(0x0123456789abcdef)
	d := acquire(t, m, get("api"), "k", 2, now)
	id := d.Grant.String()
	raw, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(id) != GrantIDLen {
		t.Fatalf("id %q: %v", id, err)
	}
	if binary.BigEndian.Uint64(raw[9:]) == uint64(now) || binary.BigEndian.Uint64(raw[1:]) == d.Grant.Nonce {
		t.Fatalf("grant id %q carries the node clock or nonce in clear", id)
	}
	for _, tc := range []struct {
		name string
		m    *Map
		rule string
		key  string
		id   string
		want int64
	}{
		{"other key", m, "api", "j", id, 0},
		{"other rule", m, "other", "k", id, 0},
		{"other node", m2, "api", "k", id, 0},
		{"flipped bit", m, "api", "k", flip(id, 20), 0},
		{"own", m, "api", "k", id, 2},
		{"again", m, "api", "k", id, 0},
	} {
		n, _, err := tc.m.Refill(get(tc.rule), tc.key, tc.id, -1, now)
		if err != nil || n != tc.want {
			t.Errorf("%s: refilled %d (%v), want %d", tc.name, n, err, tc.want)
		}
	}
	if _, err := ParseGrant(id[1:]); err == nil {
		t.Error("a short id parsed")
	}
}

func flip(id string, i int) string {
	raw, _ := base64.RawURLEncoding.DecodeString(id)
	raw[i] ^= 1
	return base64.RawURLEncoding.EncodeToString(raw)
}

// BenchmarkGrantSeal is the cost of tagging and masking one grant id.
func BenchmarkGrantSeal(b *testing.B) {
	k := newGrantKeys()
	bk := []byte("api\x00user-0000001")
	g := Grant{Nonce: 1, IssuedAt: 2, Permits: 1}
	b.ReportAllocs()
	for b.Loop() {
		k.seal(&g, bk, 7)
	}
	_ = bucket.Request{}
}
