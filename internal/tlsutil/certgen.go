package tlsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"strings"
	"time"
)

// Lifetimes of the certificates NewCA and CA.Issue make when the caller
// gives none.
const (
	// DefaultCALifetime is a CA's validity: 10 years.
	DefaultCALifetime = 10 * 365 * 24 * time.Hour
	// DefaultCertLifetime is a node or client certificate's validity: 1
	// year. Rotate before it ends (the server re-reads changed files).
	DefaultCertLifetime = 365 * 24 * time.Hour
	// backdate is how far before now certificates start, for clocks that
	// lag.
	backdate = 5 * time.Minute
)

// URIScheme is the scheme of the URI SANs that name tokenserver identities:
// tokenserver://node/ID for a node, tokenserver://client/NAME for a client.
const URIScheme = "tokenserver"

// NodeURI is the URI SAN naming node id in its certificate.
func NodeURI(id string) *url.URL {
	return &url.URL{Scheme: URIScheme, Host: "node", Path: "/" + id}
}

// ClientURI is the URI SAN naming a client in its certificate.
func ClientURI(name string) *url.URL {
	return &url.URL{Scheme: URIScheme, Host: "client", Path: "/" + name}
}

// NodeIDs returns the node ids that cert's URI SANs name
// (tokenserver://node/ID). A certificate shared by a StatefulSet's pods may
// name several.
func NodeIDs(cert *x509.Certificate) []string {
	var ids []string
	for _, u := range cert.URIs {
		if id, ok := nodeID(u); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// HasNodeID reports whether cert names node id in a URI SAN.
func HasNodeID(cert *x509.Certificate, id string) bool {
	for _, u := range cert.URIs {
		if got, ok := nodeID(u); ok && got == id {
			return true
		}
	}
	return false
}

func nodeID(u *url.URL) (string, bool) {
	if u == nil || u.Scheme != URIScheme || u.Host != "node" {
		return "", false
	}
	id := strings.TrimPrefix(u.Path, "/")
	if id == "" || strings.Contains(id, "/") {
		return "", false
	}
	return id, true
}

// CA is a certificate authority that issues tokenserver's certificates.
type CA struct {
	// Cert is the CA certificate.
	Cert *x509.Certificate
	// Key is its private key.
	Key *ecdsa.PrivateKey
	// CertPEM and KeyPEM are Cert and Key in PEM.
	CertPEM, KeyPEM []byte
}

// NewCA makes a self-signed ECDSA P-256 CA named commonName, valid for
// lifetime (DefaultCALifetime when 0).
func NewCA(commonName string, lifetime time.Duration) (*CA, error) {
	if lifetime <= 0 {
		lifetime = DefaultCALifetime
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	return newCA(der, key)
}

func newCA(der []byte, key *ecdsa.PrivateKey) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: keyPEM}, nil
}

// LoadCA reads a CA written by NewCA (or any ECDSA CA) from PEM files.
func LoadCA(certFile, keyFile string) (*CA, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load CA %s: %w", certFile, err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("load CA %s: key is %T, want ECDSA", keyFile, pair.PrivateKey)
	}
	ca, err := newCA(pair.Certificate[0], key)
	if err != nil {
		return nil, fmt.Errorf("load CA %s: %w", certFile, err)
	}
	if !ca.Cert.IsCA {
		return nil, fmt.Errorf("load CA %s: the certificate is not a CA", certFile)
	}
	return ca, nil
}

// CertRequest describes a certificate for CA.Issue.
type CertRequest struct {
	// CommonName is the subject's CN.
	CommonName string
	// OrganizationalUnits go in the subject's OU; tokenserver reads roles
	// from them in client certificates.
	OrganizationalUnits []string
	// DNSNames, IPs and URIs are the subject alternative names.
	DNSNames []string
	IPs      []net.IP
	URIs     []*url.URL
	// Server and Client set the extended key usages (a node certificate
	// has both: it serves and it dials its peers).
	Server, Client bool
	// Lifetime is the validity (DefaultCertLifetime when 0).
	Lifetime time.Duration
}

// KeyPair is an issued certificate and its key.
type KeyPair struct {
	// Cert is the certificate.
	Cert *x509.Certificate
	// CertPEM and KeyPEM are the certificate and its private key in PEM.
	CertPEM, KeyPEM []byte
}

// TLSCertificate returns the pair for a tls.Config.
func (k *KeyPair) TLSCertificate() (tls.Certificate, error) {
	return tls.X509KeyPair(k.CertPEM, k.KeyPEM)
}

// Issue makes an ECDSA P-256 certificate signed by ca.
func (ca *CA) Issue(req CertRequest) (*KeyPair, error) {
	if !req.Server && !req.Client {
		return nil, errors.New("issue certificate: neither server nor client usage")
	}
	if req.Lifetime <= 0 {
		req.Lifetime = DefaultCertLifetime
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(req.Lifetime)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.CommonName, OrganizationalUnit: req.OrganizationalUnits},
		NotBefore:    now.Add(-backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     req.DNSNames,
		IPAddresses:  req.IPs,
		URIs:         req.URIs,
	}
	if req.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if req.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("issue certificate %q: %w", req.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse certificate %q: %w", req.CommonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &KeyPair{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: keyPEM}, nil
}

// WriteFiles writes the pair to certFile (0644) and keyFile (0600).
func (k *KeyPair) WriteFiles(certFile, keyFile string) error {
	if err := os.WriteFile(certFile, k.CertPEM, 0o644); err != nil {
		return fmt.Errorf("write certificate: %w", err)
	}
	if err := os.WriteFile(keyFile, k.KeyPEM, 0o600); err != nil {
		return fmt.Errorf("write key: %w", err)
	}
	return nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return n, nil
}
