package shard

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/tokenserver/tokenserver/internal/rule"
)

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
	if _, _, err := m.Refill(get("api"), "k", id[1:], -1, now); !errors.Is(err, rule.ErrInvalid) {
		t.Errorf("a short id: %v, want rule.ErrInvalid", err)
	}
}

func flip(id string, i int) string {
	raw, _ := base64.RawURLEncoding.DecodeString(id)
	raw[i] ^= 1
	return base64.RawURLEncoding.EncodeToString(raw)
}
