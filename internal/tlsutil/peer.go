package tlsutil

// The peer side: the Raft listener's and the peer dialers' configs, and
// how a certificate is recognized as a node's.

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

func (r *Reloader) peerReady() error {
	switch {
	case r.files.PeerCertFile == "":
		return errors.New("tls: no peer certificate (--peer-tls-cert and --peer-tls-key, or --tls-cert and --tls-key)")
	case r.files.PeerCAFile == "":
		return errors.New("tls: no peer CA (--peer-tls-ca, or --tls-client-ca)")
	}
	return nil
}

// PeerServerConfig returns the config of the Raft listener: the peer
// certificate, and mutual TLS that refuses a client whose certificate is not
// a peer's (see PeerID).
func (r *Reloader) PeerServerConfig() (*tls.Config, error) {
	if err := r.peerReady(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.cur.Load().peerServer, nil
		},
	}, nil
}

// PeerClientConfig returns the config a node dials its peers with (Raft,
// forwarding, health checks, join probes): it presents the peer certificate,
// sends PeerServerName, and accepts only a server whose certificate is a
// peer's, not denied. Host names are not checked: the peer CA is the
// trust. Where the node id of the peer is known, PeerClientConfigFor also
// checks it.
func (r *Reloader) PeerClientConfig() (*tls.Config, error) { return r.PeerClientConfigFor("") }

// PeerClientConfigFor is PeerClientConfig for dialing node id: the
// server's certificate must also name id (a tokenserver://node/ID URI SAN,
// or a URI that PeerIDPattern maps to id), so that a member's address
// taken over by another node's certificate is refused. A certificate that
// names no node id at all (a CA of peers only, or a PeerIDPattern without
// {id}) cannot be checked and is accepted, the CA being the trust. id ""
// checks no id.
func (r *Reloader) PeerClientConfigFor(id string) (*tls.Config, error) {
	if err := r.peerReady(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: PeerServerName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.cur.Load().peerCert, nil
		},
		// Verification is VerifyConnection's, against the current pool.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return r.cur.Load().verifyPeerServer(cs, id)
		},
	}, nil
}

// ExpectPeerID returns a tls.Config.VerifyConnection that accepts a
// server only when its verified certificate names node id (see
// PeerClientConfigFor) and is not denied, for configs built elsewhere; it
// needs VerifiedChains (a config without InsecureSkipVerify).
func (r *Reloader) ExpectPeerID(id string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		m := r.cur.Load()
		if err := m.refuseDenied(cs); err != nil {
			return err
		}
		return m.checkNamesID(cs.VerifiedChains, id)
	}
}

// verifyPeerServer verifies a peer server's certificate chain against the
// peer pool, and that it is a node's, not denied, and names id (unless id
// is "").
func (m *material) verifyPeerServer(cs tls.ConnectionState, id string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: the peer sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	chains, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots: m.peerPool, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("tls: peer certificate: %w", err)
	}
	if _, ok := m.peerID(chains); !ok {
		return errors.New("tls: the server's certificate is not a node certificate (no tokenserver://node/ID URI SAN)")
	}
	if m.isDenied(cs.PeerCertificates[0]) {
		return fmt.Errorf("tls: the server's certificate serial %X is on the deny list", cs.PeerCertificates[0].SerialNumber)
	}
	return m.checkNamesID(chains, id)
}

// checkNamesID checks that the leaf of chains names node id, when it names
// any id; id "" checks nothing.
func (m *material) checkNamesID(chains [][]*x509.Certificate, id string) error {
	if id == "" || len(chains) == 0 || len(chains[0]) == 0 {
		return nil
	}
	ids := m.nodeIDs(chains[0][0])
	if len(ids) == 0 || slices.Contains(ids, id) {
		return nil
	}
	return fmt.Errorf("tls: dialed node %q, but the server's certificate names node %s", id, strings.Join(ids, ", "))
}

// verifyPeerClient refuses a client of the Raft listener (or of the
// client-facing port asking for PeerServerName) whose verified certificate
// is not a peer's, or is denied.
func (m *material) verifyPeerClient(cs tls.ConnectionState) error {
	if _, ok := m.peerID(cs.VerifiedChains); !ok {
		return errors.New("tls: the client's certificate is not a node certificate (no tokenserver://node/ID URI SAN)")
	}
	return m.refuseDenied(cs)
}

// PeerID reports whether a connection's verified client certificate is a
// peer's and returns the node id it names ("" when it names none). A peer
// certificate chains to the peer CA; when that CA is also a client CA (one
// CA for clients and nodes, as `tokenctl certs` makes), it must also name a
// node in a tokenserver://node/ID URI SAN, so that client certificates are
// never peers. Cheap: no signature is checked again.
func (r *Reloader) PeerID(cs *tls.ConnectionState) (string, bool) {
	if cs == nil {
		return "", false
	}
	return r.cur.Load().peerID(cs.VerifiedChains)
}

func (m *material) peerID(chains [][]*x509.Certificate) (string, bool) {
	for _, chain := range chains {
		if len(chain) == 0 {
			continue
		}
		root := chain[len(chain)-1]
		if !contains(m.peerCAs, root) {
			continue
		}
		if id, ok := m.peerName(chain[0]); ok {
			return id, true
		}
		if !contains(m.clientCAs, root) {
			return "", true // a CA of peers only
		}
	}
	return "", false
}

func contains(set []*x509.Certificate, c *x509.Certificate) bool {
	for _, s := range set {
		if s == c || bytes.Equal(s.Raw, c.Raw) {
			return true
		}
	}
	return false
}

// nodeIDs returns the node ids cert names: its tokenserver://node/ID URI
// SANs, and the ids PeerIDPattern finds in its URIs.
func (m *material) nodeIDs(cert *x509.Certificate) []string {
	ids := NodeIDs(cert)
	for _, u := range cert.URIs {
		if id, ok := MatchPeerIDPattern(m.pattern, u.String()); ok && id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// peerName reports whether cert names a node: by a tokenserver://node/ID
// URI SAN (its first id), or by a URI matching PeerIDPattern (the id it
// holds, "" for a pattern without {id}).
func (m *material) peerName(cert *x509.Certificate) (string, bool) {
	if ids := NodeIDs(cert); len(ids) > 0 {
		return ids[0], true
	}
	for _, u := range cert.URIs {
		if id, ok := MatchPeerIDPattern(m.pattern, u.String()); ok {
			return id, true
		}
	}
	return "", false
}

// idPlaceholder stands for the node id in a PeerIDPattern.
const idPlaceholder = "{id}"

// ValidPeerIDPattern checks a PeerIDPattern: "" or an absolute URI (a
// SPIFFE ID) with at most one {id}.
func ValidPeerIDPattern(p string) error {
	if p == "" {
		return nil
	}
	if strings.Count(p, idPlaceholder) > 1 {
		return fmt.Errorf("tls: peer id pattern %q: at most one %s", p, idPlaceholder)
	}
	u, err := url.Parse(strings.Replace(p, idPlaceholder, "x", 1))
	if err != nil || u.Scheme == "" || u.Host == "" {
		return fmt.Errorf("tls: peer id pattern %q must be an absolute URI such as spiffe://trust.domain/ns/NS/sa/SA/%s", p, idPlaceholder)
	}
	return nil
}

// MatchPeerIDPattern reports whether uri matches pattern, and the node id
// that {id} stands for ("" for a pattern without {id}). An id is never
// empty and holds no "/".
func MatchPeerIDPattern(pattern, uri string) (string, bool) {
	if pattern == "" {
		return "", false
	}
	before, after, has := strings.Cut(pattern, idPlaceholder)
	if !has {
		return "", uri == pattern
	}
	if len(uri) <= len(before)+len(after) || !strings.HasPrefix(uri, before) || !strings.HasSuffix(uri, after) {
		return "", false
	}
	id := uri[len(before) : len(uri)-len(after)]
	if strings.Contains(id, "/") {
		return "", false
	}
	return id, true
}

// CheckPeerIdentity checks, at start, that the node's own peer certificate
// (--peer-tls-cert, else --tls-cert) names node id: a
// tokenserver://node/ID URI SAN, or a URI matching PeerIDPattern that maps
// to id (or matches a pattern without {id}). Peers refuse a node whose
// certificate does not, so the node would stay unready without saying
// why; the error names the flag, the file and the URI it lacks. Nil
// without a peer certificate.
func (r *Reloader) CheckPeerIdentity(id string) error {
	m := r.cur.Load()
	if m == nil || m.peerCert == nil {
		return nil
	}
	leaf := m.peerCert.Leaf
	if slices.Contains(m.nodeIDs(leaf), id) {
		return nil
	}
	if name, ok := m.peerName(leaf); ok && name == "" && len(NodeIDs(leaf)) == 0 {
		return nil // a pattern without {id}: a shared identity
	}
	flag := "--peer-tls-cert"
	if r.files.PeerCertFile == r.files.CertFile {
		flag = "--tls-cert (the peer certificate while --peer-tls-cert is not set)"
	}
	var uris []string
	for _, u := range leaf.URIs {
		uris = append(uris, u.String())
	}
	want := NodeURI(id).String()
	if m.pattern != "" {
		want += " or " + strings.Replace(m.pattern, idPlaceholder, id, 1)
	}
	return fmt.Errorf("%s %s (subject %q) is not node %s's peer certificate: it lacks the URI SAN %s (its URIs: [%s]); "+
		"issue it with that URI, or give the pattern of your CA's peer URIs (a SPIFFE ID with {id})",
		flag, r.files.PeerCertFile, leaf.Subject.String(), id, want, strings.Join(uris, " "))
}
