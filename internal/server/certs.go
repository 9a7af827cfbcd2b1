package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

var descCertNotAfter = prometheus.NewDesc("tokenserver_tls_cert_not_after_seconds",
	"Expiry (Unix seconds) of the certificate the node currently serves, by use: server (client-facing) or peer (to other nodes).", []string{"use"}, nil)

// certCollector exports the certificates' expiry, read at scrape time so
// that a reloaded certificate shows at once.
type certCollector struct{ sec *Security }

// Describe implements prometheus.Collector.
func (c certCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descCertNotAfter }

// Collect implements prometheus.Collector.
func (c certCollector) Collect(ch chan<- prometheus.Metric) {
	for use, cert := range c.sec.certs() {
		if leaf := leafOf(cert); leaf != nil {
			ch <- prometheus.MustNewConstMetric(descCertNotAfter, prometheus.GaugeValue, float64(leaf.NotAfter.Unix()), use)
		}
	}
}

// CheckPeerCert refuses a node whose peer certificate other nodes would
// not take as node nodeID: one that does not chain to the peer CA, one
// that names no tokenserver://node/ID URI while the peer CA also signs
// client certificates (a SPIFFE ID alone, say), or one that names other
// nodes but not this one. Such a node would start and never become ready;
// the error names the flag and the missing URI. No peer TLS: nil.
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
	want := tlsutil.URIScheme + "://node/" + nodeID
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
	uris := make([]string, len(leaf.URIs))
	for i, u := range leaf.URIs {
		uris[i] = u.String()
	}
	if _, ok := sec.TLS.PeerID(&tls.ConnectionState{VerifiedChains: chains}); !ok {
		return fmt.Errorf("--peer-tls-cert (default --tls-cert) has no %s URI SAN (its URIs: [%s]) and its CA also signs client certificates: other nodes would refuse it as a peer and this node would never become ready. "+
			"Issue it with `tokenctl certs create-node %s`, or give the nodes a CA of their own with --peer-tls-ca", want, strings.Join(uris, " "), nodeID)
	}
	if ids := tlsutil.NodeIDs(leaf); len(ids) > 0 && !tlsutil.HasNodeID(leaf, nodeID) {
		return fmt.Errorf("--peer-tls-cert (default --tls-cert) names [%s] but not %s (--node-id %s): it is another node's certificate; other nodes would refuse this node's joins and writes", strings.Join(uris, " "), want, nodeID)
	}
	return nil
}
