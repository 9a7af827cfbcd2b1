// Package auth authenticates gRPC callers by their mTLS certificate or bearer token and authorizes each method by role.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/filewatch"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Source is where a principal's identity comes from.
type Source uint8

// The sources of principals.
const (
	// SourceCertificate is a verified client certificate.
	SourceCertificate Source = iota + 1
	// SourceToken is a bearer token listed in the token file.
	SourceToken
	// SourcePeer is another node's peer certificate.
	SourcePeer
)

// String names s.
func (s Source) String() string {
	switch s {
	case SourceCertificate:
		return "certificate"
	case SourceToken:
		return "token"
	case SourcePeer:
		return "peer"
	}
	return "none"
}

// Principal is an authenticated caller. Principals are shared between
// calls: never modify one.
type Principal struct {
	// Name identifies the caller: a certificate's URI SAN, DNS SAN or CN,
	// a token file's PRINCIPAL, or "node:ID" for a peer.
	Name string
	// Roles are the roles granted (before implication: admin implies all,
	// editor implies viewer).
	Roles Role
	// Source is where the identity comes from.
	Source Source
	// NodeID is a peer's node id as its certificate names it ("" when it
	// names none, or for other sources).
	NodeID string
	// OnBehalfOf is, on a write a peer forwarded (to the leader), the
	// caller the peer forwarded it for, as Actor returned there.
	OnBehalfOf string
	// Joining marks a peer whose node id is not in the cluster's
	// membership: it may call JoinCluster, as itself only (see CheckJoin),
	// and nothing else.
	Joining bool
	// Scope, when set, limits the principal to rule names matching it
	// (see scope.go).
	Scope string

	have   Role              // Roles expanded
	digest [32]byte          // a token's SHA-256 (SourceToken)
	leaf   *x509.Certificate // the verified certificate (SourceCertificate, SourcePeer)
}

// Has reports whether p holds role r, directly or by implication.
func (p *Principal) Has(r Role) bool { return p != nil && p.have&r == r }

// IsPeer reports whether p is another node.
func (p *Principal) IsPeer() bool { return p != nil && p.Source == SourcePeer }

// Actor is who to record as the author of a write: the caller a peer
// forwarded the call for, else String.
func (p *Principal) Actor() string {
	if p != nil && p.OnBehalfOf != "" {
		return p.OnBehalfOf
	}
	return p.String()
}

// Via is, on a call a peer forwarded for another caller, the forwarding
// node ("peer:node:ID"); "" otherwise. Audit logs name both: principal=
// Actor, via=Via.
func (p *Principal) Via() string {
	if p == nil || p.OnBehalfOf == "" {
		return ""
	}
	return p.String()
}

// AuditAttrs are the slog attributes that name the author of a call:
// principal (Actor), and via (the forwarding node) when a peer forwarded
// it.
func (p *Principal) AuditAttrs() []any {
	if v := p.Via(); v != "" {
		return []any{"principal", p.Actor(), "via", v}
	}
	return []any{"principal", p.Actor()}
}

// String is "source:name", for logs.
func (p *Principal) String() string {
	if p == nil {
		return "anonymous"
	}
	return p.Source.String() + ":" + p.Name
}

func newPrincipal(name string, roles Role, src Source) *Principal {
	return &Principal{Name: name, Roles: roles, Source: src, have: roles.expand()}
}

type principalKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal Authorize put in ctx (nil, false when
// auth is off or the method is open).
func FromContext(ctx context.Context) (*Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(*Principal)
	return p, ok && p != nil
}

// IsPeer reports whether the call in ctx comes from another node: its
// connection's client certificate is a peer certificate (see
// tlsutil.Reloader.PeerID), as recorded by Authorize or by
// ServerCredentials. The forwarded marker counts only when it is true.
func IsPeer(ctx context.Context) bool {
	if p, ok := FromContext(ctx); ok {
		return p.IsPeer()
	}
	if pr, ok := peer.FromContext(ctx); ok {
		if ai, ok := pr.AuthInfo.(AuthInfo); ok {
			return ai.Principal.IsPeer()
		}
	}
	return false
}

// PeerChecker tells peer certificates from others; *tlsutil.Reloader is
// one.
type PeerChecker interface {
	// PeerID reports whether the connection's verified client certificate
	// is a peer's, and the node id it names.
	PeerID(cs *tls.ConnectionState) (string, bool)
}

// AuthInfo is the credentials.AuthInfo of connections accepted through
// ServerCredentials: the TLS state and the connection's principal,
// computed once at the handshake.
type AuthInfo struct {
	credentials.TLSInfo
	// Principal is the client certificate's principal, a peer's, or nil
	// when the client sent no certificate.
	Principal *Principal
}

// ServerCredentials are gRPC transport credentials over cfg (typically
// tlsutil.Reloader.ServerConfig) that identify each connection's client
// certificate once at the handshake, so that per-call authorization costs
// no certificate parsing. peers may be nil (no peer is recognized).
func ServerCredentials(cfg *tls.Config, peers PeerChecker) credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: credentials.NewTLS(cfg), peers: peers}
}

type serverCreds struct {
	credentials.TransportCredentials
	peers PeerChecker
}

func (c *serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, ai, err
	}
	ti, ok := ai.(credentials.TLSInfo)
	if !ok {
		return conn, ai, nil
	}
	return conn, AuthInfo{TLSInfo: ti, Principal: identify(&ti.State, c.peers)}, nil
}

func (c *serverCreds) Clone() credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: c.TransportCredentials.Clone(), peers: c.peers}
}

// identify returns the principal of a connection's verified client
// certificate: a peer with every role, or a client whose name is the
// certificate's first URI SAN, else its first DNS SAN, else its CN, and
// whose roles are the subject's OU values that name roles.
func identify(cs *tls.ConnectionState, peers PeerChecker) *Principal {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return nil
	}
	leaf := cs.VerifiedChains[0][0]
	if peers != nil {
		if id, ok := peers.PeerID(cs); ok {
			name := "node:" + id
			if id == "" {
				name = "node:" + leaf.Subject.CommonName
			}
			p := newPrincipal(name, AllRoles, SourcePeer)
			p.NodeID, p.leaf = id, leaf
			return p
		}
	}
	p := certPrincipal(leaf)
	p.leaf = leaf
	return p
}

func certPrincipal(c *x509.Certificate) *Principal {
	var name string
	switch {
	case len(c.URIs) > 0:
		name = c.URIs[0].String()
	case len(c.DNSNames) > 0:
		name = c.DNSNames[0]
	default:
		name = c.Subject.CommonName
	}
	var roles Role
	for _, ou := range c.Subject.OrganizationalUnit {
		if r, err := ParseRole(ou); err == nil {
			roles |= r
		}
	}
	return newPrincipal(name, roles, SourceCertificate)
}

// Options configures an Authenticator.
type Options struct {
	// TokenFile is the --auth-tokens file ("" for no tokens).
	TokenFile string
	// ClientCerts says that client certificates authenticate callers
	// (--tls-client-ca is set).
	ClientCerts bool
	// Peers recognizes peer certificates when connections do not come
	// through ServerCredentials; nil leaves that to ServerCredentials.
	Peers PeerChecker
	// ReloadInterval is how often the token file is looked at (5 s when 0;
	// below 0 never).
	ReloadInterval time.Duration
	// Logger receives token file reloads; nil discards.
	Logger *slog.Logger
	// Members reports whether a node id is in the cluster's membership
	// (the Raft configuration). A peer certificate naming an id it does
	// not know is admitted only to JoinCluster, as itself (see CheckJoin).
	// Nil admits every peer (a node without membership, as in tests).
	// Streams of peers are checked again on Recheck.
	Members func(id string) bool
	// CertDenied reports whether a verified certificate (client or peer)
	// is on the deny list (tlsutil.Reloader.SerialDenied); its calls are
	// then Unauthenticated, and its streams end on Recheck. Nil denies
	// none.
	CertDenied func(*x509.Certificate) bool
	// Now is the clock of the reload metrics (time.Now when nil).
	Now func() time.Time
}

// Authenticator decides who a call comes from and whether it may run. With
// neither a token file nor client certificates it is disabled: every call
// runs, as before auth existed. It is safe for simultaneous use.
type Authenticator struct {
	o       Options
	log     *slog.Logger
	enabled bool
	tokens  atomic.Pointer[tokenTable]
	watch   *filewatch.Watcher // the token file; nil without one
	live    liveStreams        // streams to end when their principal goes
}

// New loads the token file, if any, and polls it for changes until Close.
func New(o Options) (*Authenticator, error) {
	a := &Authenticator{o: o, log: o.Logger, enabled: o.TokenFile != "" || o.ClientCerts}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.o.Now == nil {
		a.o.Now = time.Now
	}
	empty := tokenTable{}
	a.tokens.Store(&empty)
	if o.TokenFile != "" {
		w, err := filewatch.New(filewatch.Options{
			Paths:    []string{o.TokenFile},
			Interval: o.ReloadInterval,
			Load:     a.load,
			Now:      a.o.Now,
			OnError: func(err error) {
				var bl *badLinesError
				if errors.As(err, &bl) {
					return // load logged each line
				}
				a.log.Warn("auth: token file reload failed; the previous tokens stay", "file", o.TokenFile, "error", err)
			},
		})
		if err != nil {
			return nil, fmt.Errorf("--auth-tokens: %w", err)
		}
		a.watch = w
	}
	return a, nil
}

// Enabled reports whether calls are checked.
func (a *Authenticator) Enabled() bool { return a.enabled }

// Close stops polling the token file.
func (a *Authenticator) Close() {
	if a.watch != nil {
		a.watch.Close()
	}
}

// badLinesError is a token file that was installed without its bad lines.
type badLinesError struct {
	file string
	bad  []error
}

func (e *badLinesError) Error() string {
	return fmt.Sprintf("%s: %d bad lines left out (the other lines are in use): %v", e.file, len(e.bad), errors.Join(e.bad...))
}

// Unwrap returns the lines' errors.
func (e *badLinesError) Unwrap() []error { return e.bad }

// load installs the tokens of the token file's content (filewatch calls it
// once from New, then on each change). New's load must be clean: a bad
// line refuses to start. A reload leaves the bad lines out, logs each, and
// installs the rest, so that a typo in one line does not keep a removed
// token working; it still returns an error (the reload metric says not
// OK) and the bad lines are the only tokens not in effect. A content with
// no good line but some bad ones (not a token file: garbage, a binary) is
// refused as a whole and the previous tokens stay. Streams whose token
// left the table end (see Revocable).
func (a *Authenticator) load(c filewatch.Content) error {
	t, bad := parseTokenLines(c.Files[0].Data, a.o.TokenFile)
	if c.Generation <= 1 && len(bad) > 0 {
		return errors.Join(bad...)
	}
	if len(bad) > 0 && len(t) == 0 {
		return fmt.Errorf("%s: no valid line, the previous tokens stay: %w", a.o.TokenFile, errors.Join(bad...))
	}
	old := a.tokens.Load()
	a.tokens.Store(&t)
	for _, err := range bad {
		a.log.Warn("auth: token file line ignored: its token is not accepted", "error", err)
	}
	if c.Generation > 1 { // a reload, not New's load
		gone := 0
		for d, p := range *old {
			if q := t[d]; q == nil || q.Name != p.Name || q.Roles != p.Roles {
				gone++
			}
		}
		a.log.Info("auth: token file loaded", "file", a.o.TokenFile, "tokens", len(t), "revoked_or_changed", gone, "bad_lines", len(bad))
		a.Recheck()
	}
	if len(bad) > 0 {
		return &filewatch.PartialError{Err: &badLinesError{file: a.o.TokenFile, bad: bad}}
	}
	return nil
}

// Reload re-reads the token file now; on an error the previous tokens
// stay.
func (a *Authenticator) Reload() error {
	if a.watch == nil {
		return nil
	}
	return a.watch.Check()
}

// Errors of Authorize.
var (
	errNoCredential = status.Error(codes.Unauthenticated,
		"no credential: send a client certificate of the client CA or an `authorization: Bearer TOKEN` header")
	errBadToken     = status.Error(codes.Unauthenticated, "the bearer token is not in the server's token file")
	errBadHeader    = status.Error(codes.Unauthenticated, "the authorization header must be `Bearer TOKEN`")
	errTokenTooLong = status.Errorf(codes.Unauthenticated, "the bearer token is longer than %d bytes", MaxTokenBytes)
	errCertDenied   = status.Error(codes.Unauthenticated, "the client certificate's serial number is on the server's deny list")
)

// MaxTokenBytes bounds a bearer token. A longer authorization header is
// refused before its token is trimmed or hashed: tokens NewToken makes
// are 43 bytes, and an attacker's megabytes cost no hashing.
const MaxTokenBytes = 4096

// Authorize finds the principal of the call to fullMethod in ctx and checks
// that it holds the method's role. It returns ctx carrying the principal
// (FromContext), or a status error: Unauthenticated without a valid
// credential, PermissionDenied naming the missing role. Order: a peer
// certificate (every role); else a bearer token, which decides when
// present; else a client certificate. Health checks are open; reflection
// needs any principal; a method it does not know needs admin.
func (a *Authenticator) Authorize(ctx context.Context, fullMethod string) (context.Context, error) {
	if !a.enabled {
		return ctx, nil
	}
	m := rule(fullMethod)
	if m.access == accessOpen {
		return ctx, nil
	}
	p, err := a.principal(ctx)
	if err != nil {
		return ctx, err
	}
	if p.Joining && fullMethod != pb.AdminService_JoinCluster_FullMethodName {
		return ctx, status.Errorf(codes.PermissionDenied, "%s is not a member of the cluster: it may only join it, as itself", p)
	}
	if m.access == accessRole && !p.Has(m.role) {
		return ctx, status.Errorf(codes.PermissionDenied, "%s lacks role %s for %s", p, m.role, fullMethod)
	}
	if err := p.scopeAllows(fullMethod); err != nil {
		return ctx, err
	}
	if m.write && p.IsPeer() && !p.Joining {
		if v := metadata.ValueFromIncomingContext(ctx, PrincipalHeader); len(v) > 0 && v[0] != "" {
			fp := *p
			fp.OnBehalfOf = v[0]
			p = &fp
		}
	}
	return context.WithValue(ctx, principalKey{}, p), nil
}

// PrincipalHeader carries, on a write a node forwards to another (a
// follower to the leader), the caller it forwards for. It counts only
// from a peer.
const PrincipalHeader = pb.PrincipalHeader

// ForwardContext returns ctx for forwarding the call in it to another node:
// with PrincipalHeader naming the caller (Actor), so that the leader logs
// and records the write's real author rather than the forwarding node.
func ForwardContext(ctx context.Context) context.Context {
	p, ok := FromContext(ctx)
	if !ok {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, PrincipalHeader, p.Actor())
}

func (a *Authenticator) principal(ctx context.Context) (*Principal, error) {
	var cert *Principal
	if pr, ok := peer.FromContext(ctx); ok {
		switch ai := pr.AuthInfo.(type) {
		case AuthInfo:
			cert = ai.Principal
		case credentials.TLSInfo:
			cert = identify(&ai.State, a.o.Peers)
		}
	}
	if cert != nil && cert.leaf != nil && a.o.CertDenied != nil && a.o.CertDenied(cert.leaf) {
		return nil, errCertDenied
	}
	if cert.IsPeer() {
		if cert.NodeID != "" && a.o.Members != nil && !a.o.Members(cert.NodeID) {
			j := *cert
			j.Joining = true
			return &j, nil
		}
		return cert, nil
	}
	if a.o.TokenFile != "" {
		if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
			return a.token(v[0])
		}
	}
	if cert != nil && a.o.ClientCerts {
		return cert, nil
	}
	return nil, errNoCredential
}

// token looks up a bearer token by its SHA-256 digest. Only digests are
// compared: the time a lookup takes depends on the digest of the caller's
// guess, which tells nothing about any stored token (finding a token from
// a digest prefix is a preimage attack), so the comparison is constant-time
// with respect to the secrets. The file holds digests only.
func (a *Authenticator) token(header string) (*Principal, error) {
	const prefix = "bearer "
	if len(header) > len(prefix)+MaxTokenBytes+2 { // +2: a little whitespace
		return nil, errTokenTooLong
	}
	if len(header) <= len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return nil, errBadHeader
	}
	tok := strings.TrimSpace(header[len(prefix):])
	// Hash the string's bytes in place: no copy, no allocation.
	d := sha256.Sum256(unsafe.Slice(unsafe.StringData(tok), len(tok)))
	if p, ok := (*a.tokens.Load())[d]; ok {
		return p, nil
	}
	return nil, errBadToken
}

// UnaryInterceptor authorizes unary calls (for a server with no unary
// interceptor of its own; otherwise call Authorize from it).
func (a *Authenticator) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := a.Authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor authorizes streaming calls, and ends a stream whose
// principal is revoked while it runs (see Revocable).
func (a *Authenticator) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := a.Authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		ctx, stop := a.Revocable(ctx)
		defer stop()
		return StreamError(ctx, handler(srv, &principalStream{ServerStream: ss, ctx: ctx}))
	}
}

type principalStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *principalStream) Context() context.Context { return s.ctx }
