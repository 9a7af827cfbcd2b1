package server

import (
	"crypto/tls"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
)

// Security configures a node's TLS and authentication. The zero value is
// the no-flag node: plain TCP everywhere and every call allowed (which
// cmd/tokenserver permits only on loopback addresses or with --insecure,
// see auth.CheckExposure).
type Security struct {
	// TLS holds the node's certificates (--tls-cert ... --peer-tls-ca) and
	// re-reads them when they change. Nil or not Enabled: plain TCP. When
	// enabled it must hold a client-facing certificate: the gRPC port
	// serves TLS with it (peers reach each other's gRPC port too).
	TLS *tlsutil.Reloader
	// ClientAuth is how the gRPC port treats client certificates
	// (--tls-client-auth).
	ClientAuth tlsutil.ClientAuth
	// HTTPTLS serves the HTTP port (/metrics, /healthz, /readyz) over TLS
	// with the same certificate when TLS is on (--http-tls).
	HTTPTLS bool
	// Auth authenticates and authorizes every gRPC call (--auth-tokens,
	// client certificates). Nil or not Enabled: every call runs.
	Auth *auth.Authenticator
	// Members is the Raft configuration's node ids that Auth checks peer
	// certificates against (auth.Options.Members: Members.Contains); the
	// node keeps it current. Nil: not tracked.
	Members *Membership
	// Insecure records --insecure: the node was told to serve non-loopback
	// addresses with neither TLS nor authentication. NodeStatus reports it.
	Insecure bool
}

// tlsOn reports whether the gRPC port serves TLS.
func (s *Security) tlsOn() bool { return s.TLS != nil && s.TLS.Enabled() }

// authOn reports whether calls are authenticated.
func (s *Security) authOn() bool { return s.Auth != nil && s.Auth.Enabled() }

// peerTLS returns the Raft listener's and the peer dialers' configs, or
// nil, nil when there is no peer certificate and CA (peers then talk in
// plain TCP).
func (s *Security) peerTLS() (server, client *tls.Config) {
	if !s.tlsOn() {
		return nil, nil
	}
	srv, err := s.TLS.PeerServerConfig()
	if err != nil {
		return nil, nil
	}
	cli, err := s.TLS.PeerClientConfig()
	if err != nil {
		return nil, nil
	}
	return srv, cli
}

// serverOption is the gRPC server's transport credentials: TLS that
// identifies each connection's client certificate once at the handshake,
// or nil for plain TCP.
func (s *Security) serverOption() (grpc.ServerOption, error) {
	if !s.tlsOn() {
		return nil, nil
	}
	cfg, err := s.TLS.ServerConfig(s.ClientAuth)
	if err != nil {
		return nil, err
	}
	return grpc.Creds(auth.ServerCredentials(cfg, s.TLS)), nil
}

// httpTLS is the HTTP server's TLS config, nil for plain HTTP. It asks for
// no client certificate: probes and scrapers carry none.
func (s *Security) httpTLS() (*tls.Config, error) {
	if !s.tlsOn() || !s.HTTPTLS {
		return nil, nil
	}
	return s.TLS.ServerConfig(tlsutil.ClientAuthNone)
}

// peerDialCreds are the transport credentials a node dials its peers'
// gRPC ports with: mutual TLS against the peer CA, or plain TCP.
func peerDialCreds(client *tls.Config) credentials.TransportCredentials {
	if client == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(client)
}

// CheckPeers refuses a node whose peers could not prove who they are while
// its callers must: with TLS or authentication on, a cluster of more than
// one node (--join, --bootstrap-expect, --peers) needs a peer certificate
// and CA, so that Raft and node-to-node gRPC use mutual TLS; a single node
// whose Raft port is not on loopback needs them too unless insecure.
func CheckPeers(sec *Security, multiNode bool, raftBind string) error {
	if !sec.tlsOn() && !sec.authOn() {
		return nil
	}
	if srv, _ := sec.peerTLS(); srv != nil {
		return nil
	}
	if sec.authOn() && !sec.tlsOn() && multiNode {
		return errors.New("--auth-tokens with more than one node needs TLS between the nodes: add --tls-cert, --tls-key and a peer CA (--tls-client-ca or --peer-tls-ca); nodes prove who they are to each other with their certificates")
	}
	if multiNode {
		return errors.New("a cluster of more than one node with TLS or authentication needs a peer CA: add --peer-tls-ca (or --tls-client-ca) so that Raft and node-to-node calls use mutual TLS")
	}
	if !auth.IsLoopback(raftBind) && !sec.Insecure {
		return fmt.Errorf("the Raft address %s is not loopback and would take unauthenticated peers: add --peer-tls-ca (or --tls-client-ca) for mutual TLS between nodes, listen on 127.0.0.1, or pass --insecure", raftBind)
	}
	return nil
}

// insecure reports whether the node serves callers it cannot tell apart
// on an address other hosts reach: --insecure, or no caller
// authentication (TLS alone encrypts, it does not authenticate) on a gRPC
// address that is not loopback. NodeStatus reports it.
func (n *Node) insecure() bool {
	return n.cfg.Security.Insecure || (!n.cfg.Security.authOn() && !auth.IsLoopback(n.cfg.GRPCAddr))
}
