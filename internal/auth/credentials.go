package auth

// The client side of bearer tokens, and what a peer's certificate names.

import (
	"context"
	"net"
	"net/url"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/tlsutil"
)

// BearerToken is gRPC per-RPC credentials sending `authorization: Bearer
// Token`. Over a connection without TLS it sends the token only to a
// loopback address (a token never leaves the host in clear text).
type BearerToken struct {
	Token string
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b BearerToken) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	if err := PlaintextTokenCheck(ctx, uri...); err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + b.Token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: false,
// so that loopback works without TLS; GetRequestMetadata guards the rest.
func (b BearerToken) RequireTransportSecurity() bool { return false }

// PlaintextTokenCheck fails when the call in ctx travels without TLS to a
// host that is not a loopback address; uri is the audience gRPC passes to
// GetRequestMetadata.
func PlaintextTokenCheck(ctx context.Context, uri ...string) error {
	ri, _ := credentials.RequestInfoFromContext(ctx)
	if credentials.CheckSecurityLevel(ri.AuthInfo, credentials.PrivacyAndIntegrity) == nil {
		return nil
	}
	host := ""
	if len(uri) > 0 {
		if u, err := url.Parse(uri[0]); err == nil {
			host = u.Hostname()
		}
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return status.Errorf(codes.Unauthenticated, "refusing to send a bearer token without TLS to %q: set TLS up (a CA to verify the server)", host)
}

// PeerNamesNode reports whether the call in ctx comes over a connection
// whose client certificate is a peer certificate naming node id in a
// tokenserver://node/ID URI SAN (a certificate shared by a StatefulSet's
// pods may name several). JoinCluster uses it to check that a joining node
// is who it says; false when the certificate names no id (a peer CA
// without node URIs): then the join probe must confirm the id.
func PeerNamesNode(ctx context.Context, id string) bool {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	ai, ok := pr.AuthInfo.(AuthInfo)
	if !ok || !ai.Principal.IsPeer() {
		return false
	}
	if ai.Principal.NodeID == id && id != "" {
		return true // as the PeerChecker named it (a tokenserver or SPIFFE URI)
	}
	chains := ai.State.VerifiedChains
	return len(chains) > 0 && len(chains[0]) > 0 && tlsutil.HasNodeID(chains[0][0], id)
}
