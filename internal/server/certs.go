package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/tokenserver/tokenserver/internal/tlsutil"
)

// leafOf is the parsed leaf of a certificate, nil if there is none.
func leafOf(c *tls.Certificate) *x509.Certificate {
	if c == nil || len(c.Certificate) == 0 {
		return nil
	}
	if c.Leaf != nil {
		return c.Leaf
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return nil
	}
	return leaf
}

// certs returns the node's certificates by use ("server": the
// client-facing one; "peer": the one it presents to other nodes), as
// currently loaded; empty without TLS.
func (s *Security) certs() map[string]*tls.Certificate {
	if !s.tlsOn() {
		return nil
	}
	out := map[string]*tls.Certificate{}
	if cfg, err := s.TLS.ServerConfig(tlsutil.ClientAuthNone); err == nil && cfg.GetCertificate != nil {
		if c, err := cfg.GetCertificate(&tls.ClientHelloInfo{}); err == nil && c != nil {
			out["server"] = c
		}
	}
	if srv, _ := s.peerTLS(); srv != nil && srv.GetConfigForClient != nil {
		if inner, err := srv.GetConfigForClient(&tls.ClientHelloInfo{}); err == nil && inner != nil && len(inner.Certificates) > 0 {
			out["peer"] = &inner.Certificates[0]
		}
	}
	return out
}

// warnExpiring logs a warning for each certificate that has expired or
// expires within a week.
func (n *Node) warnExpiring(now time.Time) {
	for use, c := range n.cfg.Security.certs() {
		leaf := leafOf(c)
		switch {
		case leaf == nil:
		case now.After(leaf.NotAfter):
			n.log.Warn("tls: certificate expired: clients and peers will refuse it; replace the file (it is re-read on change)", "use", use, "not_after", leaf.NotAfter, "subject", leaf.Subject.String())
		case leaf.NotAfter.Sub(now) < 7*24*time.Hour:
			n.log.Warn("tls: certificate expires within a week", "use", use, "not_after", leaf.NotAfter, "subject", leaf.Subject.String())
		}
	}
}

// CheckPeerCert refuses a node whose peer certificate other nodes would
// not take as node nodeID: one that does not chain to the peer CA (checked
// here), and one that names no node, or another node, while peers are
// told apart by name (tlsutil.Reloader.CheckPeerIdentity: a
// tokenserver://node/ID URI SAN, or a URI matching --peer-id-pattern). A
// certificate of a CA of peers only that names no node at all is
// accepted, the CA being the trust. Such a node would start and never
// become ready; the error names the flag and the missing URI. No peer
// TLS: nil.
func CheckPeerCert(sec *Security, nodeID string) error {
	srv, _ := sec.peerTLS()
	if srv == nil || srv.GetConfigForClient == nil {
		return nil
	}
	inner, err := srv.GetConfigForClient(&tls.ClientHelloInfo{})
	if err != nil || inner == nil || len(inner.Certificates) == 0 {
		return nil
	}
	cert := &inner.Certificates[0]
	leaf := leafOf(cert)
	if leaf == nil {
		return errors.New("--peer-tls-cert (default --tls-cert): the certificate does not parse")
	}
	inter := x509.NewCertPool()
	for _, raw := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(raw); err == nil {
			inter.AddCert(c)
		}
	}
	var chains [][]*x509.Certificate
	for _, use := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		if chains, err = leaf.Verify(x509.VerifyOptions{Roots: inner.ClientCAs, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{use}}); err != nil {
			return fmt.Errorf("--peer-tls-cert (default --tls-cert) does not verify against the peer CA (--peer-tls-ca, default --tls-client-ca) for both client and server use: %w; other nodes would refuse this node", err)
		}
	}
	id, isPeer := sec.TLS.PeerID(&tls.ConnectionState{VerifiedChains: chains})
	if isPeer && id == "" && len(tlsutil.NodeIDs(leaf)) == 0 {
		return nil // a CA of peers only, or a pattern without {id}: no node named
	}
	err = sec.TLS.CheckPeerIdentity(nodeID)
	switch {
	case err == nil:
		return nil
	case !isPeer:
		return fmt.Errorf("%w. Other nodes would refuse it as a peer and this node would never become ready: issue it with `tokenctl certs create-node %s`, set --peer-id-pattern, or give the nodes a CA of their own with --peer-tls-ca", err, nodeID)
	}
	return fmt.Errorf("%w. It names another node, not %s (--node-id %s): other nodes would refuse this node's joins and writes", err, tlsutil.NodeURI(nodeID), nodeID)
}
