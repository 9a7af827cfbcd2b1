package xds

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

// DefaultNodeID is the node id sent when none is given, as the reference's
// CONFIG_GRPC_XDS_NODE_ID default.
const DefaultNodeID = "default"

// Config is the xDS client's configuration: one field per --envoy-xds-* flag
// plus the reconnect backoff. Start from DefaultConfig and set fields.
type Config struct {
	// Server is the management server's address, host:port
	// (--envoy-xds-server). Empty turns the xDS client off, and then every
	// other field must be empty too.
	Server string
	// NodeID is the node id sent to the server, which keys its snapshots by
	// it (--envoy-xds-node-id). Required with Server.
	NodeID string
	// NodeMetadata is the node metadata as comma-separated KEY=VALUE pairs
	// with string values (--envoy-xds-node-metadata), as the reference's
	// CONFIG_GRPC_XDS_NODE_METADATA. Unlike the reference, a pair without
	// '=' or with an empty key is refused rather than dropped.
	NodeMetadata string
	// TLSCA is a PEM bundle of the CAs that verify the server's certificate
	// (--envoy-xds-tls-ca). Setting it turns TLS on; without it, TLS uses
	// the system roots.
	TLSCA string
	// TLSCert and TLSKey are the PEM client certificate and key presented
	// for mTLS (--envoy-xds-tls-cert, --envoy-xds-tls-key); both or neither.
	// Setting them turns TLS on.
	TLSCert string
	TLSKey  string
	// TLSServerName is the name the server's certificate must carry, when
	// it differs from Server's host (--envoy-xds-tls-server-name), as the
	// reference's CONFIG_GRPC_XDS_SERVER_TLS_SAN. Setting it turns TLS on.
	TLSServerName string
	// Backoff paces reconnects, both of the connection (gRPC's own dialer)
	// and of a stream that ends; it resets once a stream delivers a set.
	Backoff backoff.Config
}

// DefaultConfig is the configuration with every default: node id "default",
// and gRPC's connection backoff with its maximum lowered to 30 seconds so
// that a gateway restart is noticed soon.
func DefaultConfig() Config {
	b := backoff.DefaultConfig
	b.MaxDelay = 30 * time.Second
	return Config{NodeID: DefaultNodeID, Backoff: b}
}

// Enabled reports whether an xDS server is configured.
func (c Config) Enabled() bool { return c.Server != "" }

// TLSEnabled reports whether the client dials with TLS: when a CA, a client
// certificate or a server name is given.
func (c Config) TLSEnabled() bool {
	return c.TLSCA != "" || c.TLSCert != "" || c.TLSKey != "" || c.TLSServerName != ""
}

// Validate checks the fields, naming the flag of the first one at fault. It
// does not read the TLS files; New does.
func (c Config) Validate() error {
	if !c.Enabled() {
		if c.NodeMetadata != "" || c.TLSEnabled() {
			return errors.New("--envoy-xds-node-metadata and --envoy-xds-tls-* need --envoy-xds-server")
		}
		return nil
	}
	if strings.TrimSpace(c.Server) != c.Server || strings.ContainsAny(c.Server, " \t\n") {
		return fmt.Errorf("--envoy-xds-server %q: contains white space", c.Server)
	}
	if c.NodeID == "" {
		return errors.New("--envoy-xds-node-id must not be empty")
	}
	if _, err := c.metadata(); err != nil {
		return err
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("--envoy-xds-tls-cert and --envoy-xds-tls-key must be given together")
	}
	b := c.Backoff
	switch {
	case b.BaseDelay <= 0:
		return fmt.Errorf("Backoff.BaseDelay %v must be positive", b.BaseDelay)
	case b.MaxDelay < b.BaseDelay:
		return fmt.Errorf("Backoff.MaxDelay %v must be at least Backoff.BaseDelay %v", b.MaxDelay, b.BaseDelay)
	case b.Multiplier < 1:
		return fmt.Errorf("Backoff.Multiplier %v must be at least 1", b.Multiplier)
	case b.Jitter < 0 || b.Jitter > 1:
		return fmt.Errorf("Backoff.Jitter %v must be within [0, 1]", b.Jitter)
	}
	return nil
}

// metadata parses NodeMetadata into the node's metadata Struct, nil when
// empty.
func (c Config) metadata() (*structpb.Struct, error) {
	if c.NodeMetadata == "" {
		return nil, nil
	}
	fields := map[string]*structpb.Value{}
	for _, pair := range strings.Split(c.NodeMetadata, ",") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--envoy-xds-node-metadata: %q is not KEY=VALUE", pair)
		}
		fields[k] = structpb.NewStringValue(v)
	}
	return &structpb.Struct{Fields: fields}, nil
}

// credentials reads the TLS files into the transport credentials to dial
// with: plaintext unless TLSEnabled.
func (c Config) credentials() (credentials.TransportCredentials, error) {
	if !c.TLSEnabled() {
		return insecure.NewCredentials(), nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
	if c.TLSCA != "" {
		pem, err := os.ReadFile(c.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("--envoy-xds-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--envoy-xds-tls-ca %s: no PEM certificate found", c.TLSCA)
		}
		tc.RootCAs = pool
	}
	if c.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("--envoy-xds-tls-cert/--envoy-xds-tls-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(tc), nil
}
