package tlsutil

// The deny list of certificate serial numbers (--tls-deny-serials).

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/big"
	"strings"
)

// parseSerials parses a deny list: one serial a line in hex, colons and a
// 0x prefix allowed; blank lines and # comments skipped. Bad lines are
// left out and reported with their line numbers.
func parseSerials(data []byte, name string) (map[string]struct{}, []error) {
	out := map[string]struct{}{}
	var bad []error
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		hex := strings.ReplaceAll(strings.TrimPrefix(strings.TrimPrefix(text, "0x"), "0X"), ":", "")
		n, ok := new(big.Int).SetString(hex, 16)
		if !ok || n.Sign() < 0 {
			bad = append(bad, fmt.Errorf("%s:%d: %q is not a hex serial number", name, line, text))
			continue
		}
		out[string(n.Bytes())] = struct{}{}
	}
	if err := sc.Err(); err != nil {
		bad = append(bad, fmt.Errorf("%s: %w", name, err))
	}
	return out, bad
}

// isDenied reports whether c's serial is on the deny list.
func (m *material) isDenied(c *x509.Certificate) bool {
	if len(m.denied) == 0 || c == nil || c.SerialNumber == nil {
		return false
	}
	_, ok := m.denied[string(c.SerialNumber.Bytes())]
	return ok
}

// refuseDenied fails a handshake whose verified client certificate is
// denied (a VerifyConnection).
func (m *material) refuseDenied(cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return nil
	}
	if leaf := cs.VerifiedChains[0][0]; m.isDenied(leaf) {
		return fmt.Errorf("tls: certificate serial %X is on the deny list", leaf.SerialNumber)
	}
	return nil
}

// SerialDenied reports whether c's serial number is on the current deny
// list (--tls-deny-serials). Handshakes refuse such certificates; this
// answers for connections made before the list named them (see
// auth.Options.CertDenied).
func (r *Reloader) SerialDenied(c *x509.Certificate) bool {
	m := r.cur.Load()
	return m != nil && m.isDenied(c)
}
