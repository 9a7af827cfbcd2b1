package grant

import (
	"testing"
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

// TestTagIsSipHashOfTheFields: the tag, which feeds its four fields into
// the state word by word, is SipHash-2-4 of the fields (little-endian)
// followed by the bucket key, for keys of every length modulo 8.
func TestTagIsSipHashOfTheFields(t *testing.T) {
	k := Keys{tag: [2]uint64{0x0706050403020100, 0x0f0e0d0c0b0a0908}}
	g := Grant{Nonce: 0x1122334455667788, IssuedAt: -7, Permits: 3}
	for n := range 20 {
		bk := []byte("api\x00user-0123456789abcdef")[:n]
		var msg []byte
		for _, w := range []uint64{9, g.Nonce, uint64(g.IssuedAt), uint64(g.Permits)} {
			msg = append(msg, byte(w), byte(w>>8), byte(w>>16), byte(w>>24), byte(w>>32), byte(w>>40), byte(w>>48), byte(w>>56))
		}
		msg = append(msg, bk...)
		if got, want := k.tagOf(bk, 9, &g), siphash(k.tag[0], k.tag[1], msg); got != want {
			t.Errorf("%d-byte key: tag %#x, SipHash of the fields %#x", n, got, want)
		}
	}
}

func TestIDLen(t *testing.T) {
	g := Grant{Nonce: 1, IssuedAt: -1, Permits: 1 << 60, Sum: 1<<64 - 1}
	if s := g.String(); len(s) != IDLen || IDLen != 44 {
		t.Fatalf("grant id %q is %d long; IDLen %d", s, len(s), IDLen)
	}
	if p, err := Parse(g.String()); err != nil || p != g {
		t.Fatalf("round trip: %+v %v", p, err)
	}
}

// TestSealOpen: a sealed grant opens only for its own bucket key,
// generation and Keys, and any changed field is refused.
func TestSealOpen(t *testing.T) {
	k, k2 := NewKeys(), NewKeys()
	bk := []byte("api\x00k")
	g := Grant{Nonce: 5, IssuedAt: 1000, Permits: 2}
	k.Seal(&g, bk, 1)
	id := g.String()
	for _, tc := range []struct {
		name string
		k    *Keys
		bk   string
		gen  uint64
		edit func(*Grant)
		want bool
	}{
		{"own", &k, "api\x00k", 1, nil, true},
		{"other key", &k, "api\x00j", 1, nil, false},
		{"other generation", &k, "api\x00k", 2, nil, false},
		{"other keys", &k2, "api\x00k", 1, nil, false},
		{"more permits", &k, "api\x00k", 1, func(g *Grant) { g.Permits++ }, false},
		{"other nonce", &k, "api\x00k", 1, func(g *Grant) { g.Nonce++ }, false},
		{"other time", &k, "api\x00k", 1, func(g *Grant) { g.IssuedAt++ }, false},
	} {
		p, err := Parse(id)
		if err != nil {
			t.Fatal(err)
		}
		if tc.edit != nil {
			tc.edit(&p)
		}
		if got := tc.k.Open(&p, []byte(tc.bk), tc.gen); got != tc.want {
			t.Errorf("%s: opened %v, want %v", tc.name, got, tc.want)
		}
		if tc.want && (p.Nonce != 5 || p.IssuedAt != 1000 || p.Permits != 2) {
			t.Errorf("%s: opened as %+v", tc.name, p)
		}
	}
}

func TestParseMalformed(t *testing.T) {
	g := Grant{Nonce: 1, Permits: 1}
	for _, bad := range []string{"", "x", "!!!!", g.String() + "A", "B" + g.String()[1:],
		g.String()[:20] + "\n" + g.String()[21:], g.String()[:43] + "!"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted a malformed id", bad)
		}
	}
}

// BenchmarkGrantSeal is the cost of tagging and masking one grant id.
func BenchmarkGrantSeal(b *testing.B) {
	k := NewKeys()
	bk := []byte("api\x00user-0000001")
	g := Grant{Nonce: 1, IssuedAt: 2, Permits: 1}
	b.ReportAllocs()
	for b.Loop() {
		k.Seal(&g, bk, 7)
	}
}
