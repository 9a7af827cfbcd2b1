// Package tlsutil builds tokenserver's TLS configurations (client-facing ports, Raft and node-to-node peers) from PEM files that it re-reads when they change.
package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/tokenserver/tokenserver/internal/filewatch"
)

// PeerServerName is the TLS server name (SNI) a node sends when it dials a
// peer. A client-facing listener answers it with the peer certificate
// instead of the client-facing one, so node-to-node gRPC verifies against
// the peer CA even when the client-facing certificate comes from another
// CA. Peers verify the chain to the peer CA, not host names.
const PeerServerName = "tokenserver-peer"

// DefaultReloadInterval is how often a Reloader looks at its files.
const DefaultReloadInterval = 5 * time.Second

// ClientAuth is how a client-facing listener treats client certificates.
type ClientAuth int

// The client authentication modes of --tls-client-auth.
const (
	// ClientAuthNone asks clients for no certificate and uses none: a
	// client's certificate never names the caller. Only a connection that
	// asks for PeerServerName (a peer forwarding calls) is asked for its
	// certificate, which must then be a peer's (see PeerID), or the
	// handshake fails.
	ClientAuthNone ClientAuth = iota
	// ClientAuthRequest asks for a client certificate; one that is offered
	// must chain to the client CA or the peer CA.
	ClientAuthRequest
	// ClientAuthRequire refuses a connection without a certificate that
	// chains to the client CA or the peer CA.
	ClientAuthRequire
)

// ParseClientAuth parses none, request or require.
func ParseClientAuth(s string) (ClientAuth, error) {
	switch s {
	case "none", "":
		return ClientAuthNone, nil
	case "request":
		return ClientAuthRequest, nil
	case "require":
		return ClientAuthRequire, nil
	}
	return 0, fmt.Errorf("client auth must be none, request or require, got %q", s)
}

// String returns the flag value of a.
func (a ClientAuth) String() string {
	switch a {
	case ClientAuthNone:
		return "none"
	case ClientAuthRequest:
		return "request"
	case ClientAuthRequire:
		return "require"
	}
	return fmt.Sprintf("ClientAuth(%d)", int(a))
}

// Files names the PEM files of a node. Empty peer fields default to the
// client-facing ones (--peer-tls-cert to --tls-cert, and so on).
type Files struct {
	// CertFile and KeyFile are the certificate (with its chain) and key the
	// client-facing ports serve (--tls-cert, --tls-key).
	CertFile, KeyFile string
	// ClientCAFile is the CA bundle client certificates must chain to
	// (--tls-client-ca).
	ClientCAFile string
	// PeerCertFile and PeerKeyFile are the certificate and key a node
	// presents to its peers, as server and as client (--peer-tls-cert,
	// --peer-tls-key).
	PeerCertFile, PeerKeyFile string
	// PeerCAFile is the CA bundle peer certificates must chain to
	// (--peer-tls-ca).
	PeerCAFile string
	// DenySerialsFile lists certificate serial numbers to refuse, client
	// and peer certificates alike (--tls-deny-serials): one a line, in hex
	// (colons and a 0x prefix allowed, as openssl and browsers print
	// them); blank lines and lines starting with # are skipped. Watched
	// like the other files.
	DenySerialsFile string
}

// withDefaults fills the peer files from the client-facing ones.
func (f Files) withDefaults() Files {
	if f.PeerCertFile == "" && f.PeerKeyFile == "" {
		f.PeerCertFile, f.PeerKeyFile = f.CertFile, f.KeyFile
	}
	if f.PeerCAFile == "" {
		f.PeerCAFile = f.ClientCAFile
	}
	return f
}

// Validate reports the first inconsistency between the files, naming the
// flags.
func (f Files) Validate() error {
	switch {
	case (f.CertFile == "") != (f.KeyFile == ""):
		return errors.New("--tls-cert and --tls-key go together")
	case (f.PeerCertFile == "") != (f.PeerKeyFile == ""):
		return errors.New("--peer-tls-cert and --peer-tls-key go together")
	}
	return nil
}

// Options tunes a Reloader.
type Options struct {
	// Interval is how often the files are looked at (DefaultReloadInterval
	// when 0; below 0 never: only Reload re-reads them).
	Interval time.Duration
	// Logger receives reloads and failed reloads; nil discards.
	Logger *slog.Logger
	// PeerIDPattern also recognizes peer certificates by a URI SAN that
	// matches it, for CAs that issue SPIFFE IDs (cert-manager, SPIRE):
	// e.g. spiffe://cluster.local/ns/ts/sa/tokenserver/{id}, where {id}
	// stands for the node id; without {id} the URI must equal it, and such
	// a certificate names no node id. "" recognizes tokenserver://node/ID
	// only.
	PeerIDPattern string
	// Now is the clock that expiry warnings and metrics use (time.Now
	// when nil).
	Now func() time.Time
}

// Reloader holds a node's certificates, keys and CA pools, and re-reads
// their files when their content changes (every Options.Interval; a
// Kubernetes Secret's symlink swap counts), so that new connections see new
// certificates while live ones keep going. A file that fails to load (a
// certificate and key written one after the other, caught in between)
// leaves the previous material in use until a later poll succeeds. It is
// safe for simultaneous use.
type Reloader struct {
	files Files
	o     Options
	log   *slog.Logger
	cur   atomic.Pointer[material]
	watch *filewatch.Watcher
}

// material is one loaded generation of the files.
type material struct {
	cert     *tls.Certificate // client-facing; nil without --tls-cert
	peerCert *tls.Certificate // nil without peer files
	// clientCAs and peerCAs are the parsed bundles; clientPool holds both
	// (a client-facing listener accepts peers' certificates too).
	clientCAs, peerCAs   []*x509.Certificate
	clientPool, peerPool *x509.CertPool
	server               [3]*tls.Config // client-facing, by ClientAuth
	peerOnly             *tls.Config    // client-facing, mode none, to a peer (PeerServerName)
	peerServer           *tls.Config
	denied               map[string]struct{} // denied serials (big-endian bytes)
	pattern              string              // Options.PeerIDPattern
}

// New loads files and, unless opts.Interval < 0, polls them until Close.
// With no file at all it returns a Reloader whose configs all fail: the
// caller checks Enabled.
func New(files Files, opts Options) (*Reloader, error) {
	if err := files.Validate(); err != nil {
		return nil, err
	}
	if err := ValidPeerIDPattern(opts.PeerIDPattern); err != nil {
		return nil, err
	}
	r := &Reloader{files: files.withDefaults(), o: opts, log: opts.Logger}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.o.Now == nil {
		r.o.Now = time.Now
	}
	interval := opts.Interval
	if interval == 0 {
		interval = DefaultReloadInterval
	}
	if !r.Enabled() {
		interval = -1
	}
	f := r.files
	w, err := filewatch.New(filewatch.Options{
		Paths:    []string{f.CertFile, f.KeyFile, f.ClientCAFile, f.PeerCertFile, f.PeerKeyFile, f.PeerCAFile, f.DenySerialsFile},
		Interval: interval,
		Load:     r.install,
		Now:      r.o.Now,
		OnError: func(err error) {
			r.log.Warn("tls: reload failed; still serving the previous certificates", "error", tlsError(err))
		},
	})
	if err != nil {
		return nil, tlsError(err)
	}
	r.watch = w
	return r, nil
}

// Enabled reports whether any file was given.
func (r *Reloader) Enabled() bool {
	f := r.files
	return f.CertFile != "" || f.ClientCAFile != "" || f.PeerCertFile != "" || f.PeerCAFile != ""
}

// Close stops polling.
func (r *Reloader) Close() { r.watch.Close() }

// Generation counts the loads that changed the material: 1 after New, +1
// per reload that saw new content.
func (r *Reloader) Generation() uint64 { return r.watch.Generation() }

// Reload re-reads the files now and installs them when their content
// changed. On an error the previous material stays.
func (r *Reloader) Reload() error { return tlsError(r.watch.Check()) }

// tlsError prefixes the errors of reading the files as they always read.
func tlsError(err error) error {
	var re *filewatch.ReadError
	if errors.As(err, &re) {
		return fmt.Errorf("tls: %w", err)
	}
	return err
}

// file indexes in the watcher's Content.Files (the order of its Paths).
const (
	fCert = iota
	fKey
	fClientCA
	fPeerCert
	fPeerKey
	fPeerCA
	fDeny
	nFiles
)

// install loads the files' content and makes it current (filewatch calls
// it from New, then on each change).
func (r *Reloader) install(c filewatch.Content) error {
	var contents [nFiles][]byte
	for i := range contents {
		contents[i] = c.Files[i].Data
	}
	m, err := r.load(contents)
	if err != nil {
		return err
	}
	var badDeny []error
	if r.files.DenySerialsFile != "" {
		m.denied, badDeny = parseSerials(contents[fDeny], r.files.DenySerialsFile)
		if len(badDeny) > 0 && c.Generation <= 1 {
			return errors.Join(badDeny...) // at start: refuse, an operator is there
		}
	}
	r.cur.Store(m)
	if !r.Enabled() {
		return nil
	}
	attrs := []any{"generation", c.Generation}
	if m.cert != nil {
		attrs = append(attrs, "cert_not_after", m.cert.Leaf.NotAfter)
	}
	if m.peerCert != nil {
		attrs = append(attrs, "peer_cert_not_after", m.peerCert.Leaf.NotAfter)
	}
	if m.denied != nil {
		attrs = append(attrs, "denied_serials", len(m.denied))
	}
	r.log.Info("tls: certificates loaded", attrs...)
	r.warnValidity(m)
	if len(badDeny) > 0 {
		for _, err := range badDeny {
			r.log.Warn("tls: deny list line ignored: that serial is NOT denied", "error", err)
		}
		return &filewatch.PartialError{Err: fmt.Errorf("%s: %d bad lines left out: %w", r.files.DenySerialsFile, len(badDeny), errors.Join(badDeny...))}
	}
	return nil
}

// warnValidity logs at warn each loaded certificate that is expired or not
// valid yet: handshakes with it fail, and the files are in use anyway
// (the previous ones may be no better).
func (r *Reloader) warnValidity(m *material) {
	now := r.o.Now()
	for _, nc := range m.named() {
		switch {
		case now.After(nc.cert.NotAfter):
			r.log.Warn("tls: certificate expired", "cert", nc.name, "subject", nc.cert.Subject.String(), "not_after", nc.cert.NotAfter)
		case now.Before(nc.cert.NotBefore):
			r.log.Warn("tls: certificate not valid yet", "cert", nc.name, "subject", nc.cert.Subject.String(), "not_before", nc.cert.NotBefore)
		}
	}
}

// namedCert is a loaded certificate and the cert label of its metric.
type namedCert struct {
	name string
	cert *x509.Certificate
}

// named lists the loaded certificates: the client-facing and peer
// certificates, and each CA of the bundles.
func (m *material) named() []namedCert {
	var out []namedCert
	if m.cert != nil {
		out = append(out, namedCert{"server", m.cert.Leaf})
	}
	if m.peerCert != nil {
		out = append(out, namedCert{"peer", m.peerCert.Leaf})
	}
	for _, c := range m.clientCAs {
		out = append(out, namedCert{"client_ca", c})
	}
	for _, c := range m.peerCAs {
		out = append(out, namedCert{"peer_ca", c})
	}
	return out
}

func (r *Reloader) load(c [nFiles][]byte) (*material, error) {
	f := r.files
	m := &material{pattern: r.o.PeerIDPattern}
	var err error
	if f.CertFile != "" {
		if m.cert, err = keyPair(c[fCert], c[fKey], f.CertFile, f.KeyFile); err != nil {
			return nil, err
		}
	}
	if f.PeerCertFile != "" {
		if m.peerCert, err = keyPair(c[fPeerCert], c[fPeerKey], f.PeerCertFile, f.PeerKeyFile); err != nil {
			return nil, err
		}
	}
	if f.ClientCAFile != "" {
		if m.clientCAs, err = parseCerts(c[fClientCA], f.ClientCAFile); err != nil {
			return nil, err
		}
	}
	if f.PeerCAFile != "" {
		if m.peerCAs, err = parseCerts(c[fPeerCA], f.PeerCAFile); err != nil {
			return nil, err
		}
	}
	m.clientPool, m.peerPool = x509.NewCertPool(), x509.NewCertPool()
	for _, ca := range m.clientCAs {
		m.clientPool.AddCert(ca)
	}
	for _, ca := range m.peerCAs {
		m.clientPool.AddCert(ca)
		m.peerPool.AddCert(ca)
	}
	if m.cert != nil {
		for a := range m.server {
			m.server[a] = r.serverConfig(m, ClientAuth(a))
		}
		if len(m.peerCAs) > 0 {
			m.peerOnly = r.serverConfig(m, ClientAuthNone)
			m.peerOnly.ClientAuth, m.peerOnly.ClientCAs = tls.VerifyClientCertIfGiven, m.peerPool
			m.peerOnly.VerifyConnection = func(cs tls.ConnectionState) error {
				if len(cs.VerifiedChains) == 0 {
					return nil // no certificate offered
				}
				return m.verifyPeerClient(cs)
			}
		}
	}
	if m.peerCert != nil && len(m.peerCAs) > 0 {
		m.peerServer = &tls.Config{
			MinVersion:       tls.VersionTLS12,
			Certificates:     []tls.Certificate{*m.peerCert},
			ClientAuth:       tls.RequireAndVerifyClientCert,
			ClientCAs:        m.peerPool,
			VerifyConnection: m.verifyPeerClient,
		}
	}
	return m, nil
}

// serverConfig is the client-facing config of one ClientAuth mode.
func (r *Reloader) serverConfig(m *material, a ClientAuth) *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if hello.ServerName == PeerServerName && m.peerCert != nil {
				return m.peerCert, nil
			}
			return m.cert, nil
		},
	}
	switch a {
	case ClientAuthRequire:
		c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, m.clientPool
	case ClientAuthRequest:
		c.ClientAuth, c.ClientCAs = tls.VerifyClientCertIfGiven, m.clientPool
	}
	// In mode none no certificate is asked for (peers get m.peerOnly).
	if a != ClientAuthNone {
		c.VerifyConnection = m.refuseDenied
	}
	return c
}

func keyPair(certPEM, keyPEM []byte, certFile, keyFile string) (*tls.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tls: load %s and %s: %w", certFile, keyFile, err)
	}
	return &pair, nil // Go ≥ 1.23 fills pair.Leaf
}

func parseCerts(data []byte, name string) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for len(data) > 0 {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("tls: parse %s: %w", name, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", name)
	}
	return certs, nil
}

// ServerConfig returns the config of a client-facing listener (gRPC, and
// HTTP unless --http-tls=false): TLS 1.2 at least, ALPN h2 and http/1.1,
// the current certificate on every new handshake, and client certificates
// verified by mode a against the client CA plus the peer CA. In mode none
// only a peer (asking for PeerServerName) is asked for a certificate.
// Certificates whose serial is on the deny list are refused.
func (r *Reloader) ServerConfig(a ClientAuth) (*tls.Config, error) {
	if r.files.CertFile == "" {
		return nil, errors.New("tls: no server certificate (--tls-cert, --tls-key)")
	}
	if a != ClientAuthNone && r.files.ClientCAFile == "" && r.files.PeerCAFile == "" {
		return nil, fmt.Errorf("tls: --tls-client-auth=%s needs --tls-client-ca", a)
	}
	if a < ClientAuthNone || a > ClientAuthRequire {
		return nil, fmt.Errorf("tls: unknown client auth %d", a)
	}
	get := func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		m := r.cur.Load()
		if a == ClientAuthNone && hello.ServerName == PeerServerName && m.peerOnly != nil {
			return m.peerOnly, nil
		}
		return m.server[a], nil
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		NextProtos:         []string{"h2", "http/1.1"},
		GetConfigForClient: get,
		// Unused while GetConfigForClient answers, but net/http looks for
		// a certificate source.
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return r.cur.Load().cert, nil },
	}, nil
}
