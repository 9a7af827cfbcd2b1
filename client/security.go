package client

import (
	"context"
	"crypto/tls"
	"net"
	"net/url"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// WithTLS dials every node over TLS with cfg: set RootCAs to the CA that
// signed the servers' certificates, and Certificates for mTLS. The server
// name defaults to each node's host as the cluster view names it (its
// advertised gRPC address), so the node certificates must carry those
// names; cfg is cloned, never modified.
func WithTLS(cfg *tls.Config) Option {
	return WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

// WithToken sends `authorization: Bearer token` with every call, for a
// server started with --auth-tokens. Without WithTLS the token is sent only
// to loopback addresses; to any other host the call fails with
// Unauthenticated rather than send it in clear text.
func WithToken(token string) Option {
	return WithDialOptions(grpc.WithPerRPCCredentials(bearerToken(token)))
}

// bearerToken is the per-RPC credential of WithToken.
type bearerToken string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b bearerToken) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	ri, _ := credentials.RequestInfoFromContext(ctx)
	if credentials.CheckSecurityLevel(ri.AuthInfo, credentials.PrivacyAndIntegrity) != nil {
		host := ""
		if len(uri) > 0 {
			if u, err := url.Parse(uri[0]); err == nil {
				host = u.Hostname()
			}
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, status.Errorf(codes.Unauthenticated, "tokenserver client: refusing to send the bearer token without TLS to %q (add WithTLS)", host)
		}
	}
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: false
// so that loopback works without TLS; GetRequestMetadata guards the rest.
func (bearerToken) RequireTransportSecurity() bool { return false }
