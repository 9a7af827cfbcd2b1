// Package console serves the web console at /ui/: server-rendered pages over
// a Backend interface, with sessions, CSRF protection and embedded assets.
//
// The console keeps no state of its own beyond sessions: every page asks the
// Backend, passing the caller's credential, and the Backend decides what the
// caller may see or change. Pages are html/template; a small vanilla JS file
// polls a JSON API under /ui/api/ for live figures and draws charts with the
// vendored uPlot (assets/vendor/uplot, see its README). Everything is
// embedded with go:embed, so the console works with no internet.
//
// Sessions are kept in memory and hand-written (about a hundred lines):
// the standard library has none, and the console needs little: a random id
// in an HttpOnly, SameSite=Strict cookie (Secure over TLS), a CSRF token per
// session checked on every POST, idle and absolute expiry, and a bound on
// their number. The bearer token given at login stays on the server; it is
// never put in a URL, a page or browser storage.
//
// The node mounts it on its HTTP port, whose TLS (and client CA) it shares:
//
//	mux.Handle("/ui/", console.New(backend, console.Options{NoAuth: loopbackWithoutAuth}))
//
// where backend adapts the node's AdminService and authorizer to Backend.
// Unified diffs between rule versions come from github.com/pmezard/go-difflib.
package console

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Options configures the console. The zero value is usable: it requires a
// login or a client certificate, with the defaults noted on each field.
type Options struct {
	// NoAuth means the node serves without TLS or tokens on a loopback
	// address: no login is asked for and requests carry no credential
	// (the Backend still decides, as the API does).
	NoAuth bool
	// SessionIdle ends a session unused this long (default 30 minutes).
	SessionIdle time.Duration
	// SessionMaxAge ends a session this long after login (default 12
	// hours).
	SessionMaxAge time.Duration
	// MaxSessions bounds the sessions kept; at the bound the least
	// recently used one ends (default 1024).
	MaxSessions int
	// BackendTimeout bounds each Backend call (default 10 seconds).
	BackendTimeout time.Duration
	// Now returns the current time (default time.Now); tests pass a fake
	// clock.
	Now func() time.Time
	// Logger receives the console's logs (default slog.Default()).
	Logger *slog.Logger
}

func (o *Options) setDefaults() {
	if o.SessionIdle <= 0 {
		o.SessionIdle = 30 * time.Minute
	}
	if o.SessionMaxAge <= 0 {
		o.SessionMaxAge = 12 * time.Hour
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = 1024
	}
	if o.BackendTimeout <= 0 {
		o.BackendTimeout = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// maxBody bounds a request body (a form with a rule definition).
const maxBody = 1 << 20

// cookieName names the session cookie.
const cookieName = "tokenserver_console"

// handler is the console. Safe for concurrent use.
type handler struct {
	backend  Backend
	opts     Options
	sessions *sessionStore
	pages    *renderer
	mux      *http.ServeMux
}

// New returns the console, to be mounted at /ui/ on the node's HTTP port
// (with the same TLS as the node's API). It serves only paths under /ui/.
func New(backend Backend, opts Options) http.Handler {
	opts.setDefaults()
	h := &handler{
		backend:  backend,
		opts:     opts,
		sessions: newSessionStore(opts.Now, opts.SessionIdle, opts.SessionMaxAge, opts.MaxSessions),
		pages:    newRenderer(),
		mux:      http.NewServeMux(),
	}
	h.routes()
	return h
}

func (h *handler) routes() {
	m := h.mux
	m.Handle("GET /ui/assets/", h.pages.assets())
	m.HandleFunc("GET /ui/login", h.loginPage)
	m.HandleFunc("POST /ui/login", h.login)
	m.HandleFunc("POST /ui/logout", h.page(h.logout))

	m.HandleFunc("GET /ui/{$}", h.page(h.clusterPage))
	m.HandleFunc("GET /ui/rules", h.page(h.rulesPage))
	m.HandleFunc("GET /ui/rules/{name}", h.page(h.rulePage))
	m.HandleFunc("GET /ui/rules/{name}/edit", h.page(h.editPage))
	m.HandleFunc("POST /ui/rules/{name}/edit", h.page(h.editRule))
	m.HandleFunc("GET /ui/new-rule", h.page(h.editPage))
	m.HandleFunc("POST /ui/new-rule", h.page(h.editRule))
	m.HandleFunc("GET /ui/rules/{name}/diff", h.page(h.diffPage))
	m.HandleFunc("GET /ui/rules/{name}/rollback", h.page(h.rollbackPage))
	m.HandleFunc("POST /ui/rules/{name}/rollback", h.page(h.rollback))
	if _, ok := h.backend.(CostEditor); ok {
		m.HandleFunc("POST /ui/rules/{name}/cost", h.page(h.saveCost))
	}
	if _, ok := h.backend.(OverrideLister); ok {
		m.HandleFunc("GET /ui/overrides", h.page(h.overridesPage))
		if _, ok := h.backend.(OverrideEditor); ok {
			m.HandleFunc("POST /ui/overrides", h.page(h.putOverride))
			m.HandleFunc("POST /ui/overrides/delete", h.page(h.deleteOverride))
		}
	}
	if _, ok := h.backend.(EnvoyDomainLister); ok {
		m.HandleFunc("GET /ui/envoy", h.page(h.envoyPage))
	}

	m.HandleFunc("GET /ui/part/members", h.page(h.membersPart))
	m.HandleFunc("GET /ui/part/rules/{name}/top", h.page(h.topPart))
	if _, ok := h.backend.(BoundReader); ok {
		m.HandleFunc("GET /ui/part/rules/{name}/bound", h.page(h.boundPart))
	}
	m.HandleFunc("GET /ui/api/cluster", h.api(h.apiCluster))
	m.HandleFunc("GET /ui/api/rules", h.api(h.apiRules))
	m.HandleFunc("GET /ui/api/rules/{name}/series", h.api(h.apiSeries))
	m.HandleFunc("GET /ui/api/rules/{name}/top", h.api(h.apiTop))
}

// ServeHTTP sets the security headers every answer carries and routes.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	// Not no-referrer: with it browsers send "Origin: null", which sameOrigin refuses.
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Frame-Options", "DENY")
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	}
	h.mux.ServeHTTP(w, r)
}

// request is one authenticated request.
type request struct {
	*http.Request
	sess *session
	cred Credential
	ctx  context.Context
}

// pageFunc serves a page for an authenticated caller.
type pageFunc func(w http.ResponseWriter, r *request)

// page authenticates a page request, redirecting to the login form when
// the caller has no credential, and checks CSRF on every POST.
func (h *handler) page(f pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, hr *http.Request) {
		r, ok := h.authenticate(w, hr)
		if !ok {
			h.toLogin(w, hr, "")
			return
		}
		if hr.Method == http.MethodPost && !h.checkWrite(w, r) {
			return
		}
		f(w, r)
	}
}

// api authenticates a JSON API request: 401 without a credential.
func (h *handler) api(f pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, hr *http.Request) {
		r, ok := h.authenticate(w, hr)
		if !ok {
			writeJSONError(w, status.Error(codes.Unauthenticated, "sign in first"))
			return
		}
		f(w, r)
	}
}

// authenticate finds the caller's session, or opens one for a client
// certificate or a no-auth node once the Backend accepts it.
func (h *handler) authenticate(w http.ResponseWriter, hr *http.Request) (*request, bool) {
	var sess *session
	if c, err := hr.Cookie(cookieName); err == nil {
		sess = h.sessions.get(c.Value)
	}
	cert, hasCert := peerCert(hr.TLS)
	if sess != nil && sess.certHash != ([32]byte{}) && (!hasCert || certHash(cert) != sess.certHash) {
		h.sessions.delete(sess.id)
		sess = nil
	}
	if sess == nil && (h.opts.NoAuth || hasCert) {
		cred := Credential{TLS: hr.TLS, RemoteAddr: hr.RemoteAddr}
		ctx, cancel := context.WithTimeout(hr.Context(), h.opts.BackendTimeout)
		p, err := h.backend.WhoAmI(ctx, cred)
		cancel()
		if err != nil {
			h.opts.Logger.Debug("console: credential refused", "remote", hr.RemoteAddr, "err", err)
			return nil, false
		}
		var ch [32]byte
		if hasCert {
			ch = certHash(cert)
		}
		sess = h.sessions.create("", ch, p)
		h.setCookie(w, hr, sess.id, 0)
	}
	if sess == nil {
		return nil, false
	}
	r := &request{Request: hr, sess: sess, cred: Credential{Token: sess.token, TLS: hr.TLS, RemoteAddr: hr.RemoteAddr}}
	r.ctx = hr.Context()
	return r, true
}

// call bounds a Backend call by BackendTimeout.
func (h *handler) call(r *request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, h.opts.BackendTimeout)
}

func peerCert(cs *tls.ConnectionState) ([]byte, bool) {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return nil, false
	}
	return cs.PeerCertificates[0].Raw, true
}

func (h *handler) setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: value, Path: "/ui/", MaxAge: maxAge,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

// sameOrigin rejects a cross-site POST by its Origin header (browsers
// send it on every POST); SameSite=Strict and the CSRF token stand behind.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// checkWrite checks a POST's origin and CSRF token.
func (h *handler) checkWrite(w http.ResponseWriter, r *request) bool {
	if !sameOrigin(r.Request) {
		h.errorPage(w, r, http.StatusForbidden, "This request came from another site and was refused.")
		return false
	}
	tok := r.Header.Get("X-CSRF-Token")
	if tok == "" {
		tok = r.PostFormValue("csrf")
	}
	if !r.sess.validCSRF(tok) {
		h.errorPage(w, r, http.StatusForbidden, "The form was stale or forged (CSRF check failed). Reload the page and try again.")
		return false
	}
	return true
}

// toLogin redirects to the login form, remembering the page asked for.
func (h *handler) toLogin(w http.ResponseWriter, r *http.Request, reason string) {
	q := url.Values{}
	if r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/ui/part/") {
		q.Set("next", r.URL.RequestURI())
	}
	if reason != "" {
		q.Set("reason", reason)
	}
	target := "/ui/login"
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// safeNext keeps a post-login target only if it is a console path.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/ui/") || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") || strings.HasPrefix(next, "/ui/login") {
		return "/ui/"
	}
	return next
}

// action names what a caller tried, for permission messages.
type action struct {
	verb string // "editing rules"
	role string // the role it needs
}

var (
	actRead     = action{"reading the cluster and its rules", "viewer"}
	actEdit     = action{"editing rules", "editor"}
	actRollback = action{"rolling back a rule", "editor"}
	actOverride = action{"changing overrides", "editor"}
)

// topRole names the caller's highest role.
func topRole(p Principal) string {
	best, rank := "", -1
	order := map[string]int{"client": 0, "viewer": 1, "editor": 2, "admin": 3}
	for _, r := range p.Roles {
		if o, ok := order[r]; ok && o > rank {
			best, rank = r, o
		}
	}
	return best
}

// errorMessage turns a Backend error into what the console shows and its
// HTTP status.
func errorMessage(err error, p Principal, a action) (int, string) {
	st, ok := status.FromError(err)
	if !ok {
		if errors.Is(err, context.DeadlineExceeded) {
			return http.StatusGatewayTimeout, "The node did not answer in time."
		}
		return http.StatusInternalServerError, "The node failed: " + err.Error()
	}
	switch st.Code() {
	case codes.PermissionDenied:
		who := "signed in without that role"
		if r := topRole(p); r != "" {
			article := "a"
			if r == "admin" || r == "editor" {
				article = "an"
			}
			who = fmt.Sprintf("%s %s", article, r)
		}
		return http.StatusForbidden, fmt.Sprintf("You are %s: %s needs the %s role. (%s)", who, a.verb, a.role, st.Message())
	case codes.Unauthenticated:
		return http.StatusUnauthorized, "Your credential was not accepted: " + st.Message()
	case codes.InvalidArgument:
		return http.StatusBadRequest, st.Message()
	case codes.NotFound:
		return http.StatusNotFound, st.Message()
	case codes.FailedPrecondition:
		return http.StatusConflict, "The rule changed since you opened it: " + st.Message()
	case codes.Unimplemented:
		return http.StatusNotImplemented, "This node does not support it: " + st.Message()
	case codes.Unavailable:
		return http.StatusServiceUnavailable, "The cluster is unavailable (no leader?): " + st.Message()
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout, "The node did not answer in time: " + st.Message()
	}
	return http.StatusInternalServerError, fmt.Sprintf("%s: %s", st.Code(), st.Message())
}

// fail shows a Backend error as a page. An Unauthenticated error ends the
// session (its token was revoked or expired) and asks for a login.
func (h *handler) fail(w http.ResponseWriter, r *request, err error, a action) {
	if status.Code(err) == codes.Unauthenticated {
		h.sessions.delete(r.sess.id)
		h.setCookie(w, r.Request, "", -1)
		h.toLogin(w, r.Request, "expired")
		return
	}
	code, msg := errorMessage(err, r.sess.principal, a)
	h.errorPage(w, r, code, msg)
}
