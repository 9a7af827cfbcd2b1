package grant

import "testing"

// FuzzParseGrant: the grant id parser never panics, what it accepts
// encodes back to the same id, and no id a client makes up opens for the
// bucket key and generation of a real grant (so gives nothing back and
// renews no lease).
func FuzzParseGrant(f *testing.F) {
	k := NewKeys()
	bk := []byte("api\x00k")
	g := Grant{Nonce: 100, IssuedAt: 100e9, Permits: 3}
	k.Seal(&g, bk, 1)
	sealed := g.String()
	f.Add(sealed)
	f.Add("")
	f.Add("AQAAABeEEbIBAAAAF4QRsgAAAAAAAAAAASnhWZCpg06R")
	f.Add(string(make([]byte, IDLen)))
	f.Fuzz(func(t *testing.T, id string) {
		g, err := Parse(id)
		if err != nil {
			return
		}
		if back := g.String(); back != id && !g.IsZero() {
			t.Fatalf("Parse(%q) encodes back as %q", id, back)
		}
		if id == sealed {
			return
		}
		if k.Open(&g, bk, 1) {
			t.Fatalf("made-up id %q opened as %+v", id, g)
		}
	})
}
