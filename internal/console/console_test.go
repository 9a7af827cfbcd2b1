package console

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

const (
	viewerToken = "viewer-secret-token"
	editorToken = "editor-secret-token"
)

// tclient is a browser stand-in: a cookie jar, no automatic redirects, and
// a check that no token ever shows in a page, a URL or a redirect.
type tclient struct {
	t    testing.TB
	srv  *httptest.Server
	http *http.Client
}

type resp struct {
	code     int
	body     string
	location string
	cookies  []*http.Cookie
}

func newTestConsole(t *testing.T, b Backend, opts Options) *tclient {
	t.Helper()
	srv := httptest.NewServer(New(b, opts))
	t.Cleanup(srv.Close)
	return newTClient(t, srv)
}

func newTClient(t testing.TB, srv *httptest.Server) *tclient {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &tclient{t: t, srv: srv, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (c *tclient) do(req *http.Request) resp {
	c.t.Helper()
	for _, tok := range []string{viewerToken, editorToken} {
		if strings.Contains(req.URL.String(), tok) {
			c.t.Fatalf("token in URL %s", req.URL)
		}
	}
	r, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	out := resp{code: r.StatusCode, body: string(b), location: r.Header.Get("Location"), cookies: r.Cookies()}
	for _, tok := range []string{viewerToken, editorToken} {
		if strings.Contains(out.body, tok) || strings.Contains(out.location, tok) {
			c.t.Fatalf("%s %s: the token shows in the answer", req.Method, req.URL.Path)
		}
	}
	return out
}

func (c *tclient) get(path string) resp {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.srv.URL+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.do(req)
}

func (c *tclient) post(path string, form url.Values, origin string) resp {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	return c.do(req)
}

func (c *tclient) login(token string) resp {
	c.t.Helper()
	r := c.post("/ui/login", url.Values{"token": {token}, "next": {"/ui/"}}, c.srv.URL)
	if r.code != http.StatusSeeOther {
		c.t.Fatalf("login: status %d, body %s", r.code, r.body)
	}
	return r
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the CSRF token from a page of the session.
func (c *tclient) csrf() string {
	c.t.Helper()
	m := csrfRE.FindStringSubmatch(c.get("/ui/new-rule").body)
	if m == nil {
		c.t.Fatal("no CSRF token in the new-rule form")
	}
	return m[1]
}

func wantStatus(t *testing.T, what string, r resp, code int, contains ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: status %d, want %d; body:\n%s", what, r.code, code, r.body)
	}
	for _, s := range contains {
		if !strings.Contains(r.body, s) {
			t.Fatalf("%s: body lacks %q:\n%s", what, s, r.body)
		}
	}
}

func TestLoginAndSession(t *testing.T) {
	b := newFakeBackend(newFakeClock())
	c := newTestConsole(t, b, Options{})

	r := c.get("/ui/rules")
	if r.code != http.StatusSeeOther || r.location != "/ui/login?next=%2Fui%2Frules" {
		t.Fatalf("without a session: %d to %q, want a redirect to the login form", r.code, r.location)
	}
	wantStatus(t, "login form", c.get("/ui/login"), http.StatusOK, `<label for="token">`)
	wantStatus(t, "bad token", c.post("/ui/login", url.Values{"token": {"nope"}}, c.srv.URL), http.StatusUnauthorized, "That token was not accepted.")

	r = c.login(viewerToken)
	if r.location != "/ui/" {
		t.Fatalf("after login: to %q, want /ui/", r.location)
	}
	if len(r.cookies) != 1 {
		t.Fatalf("login set %d cookies, want 1", len(r.cookies))
	}
	ck := r.cookies[0]
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Secure || ck.Path != "/ui/" || len(ck.Value) < 40 {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, not Secure over plain HTTP, path /ui/, a long random id", ck)
	}
	r = c.get("/ui/")
	wantStatus(t, "cluster", r, http.StatusOK, "node-1", "node-2", "node-3", "vera (viewer)")
	if n := strings.Count(r.body, `<tr class="member">`); n != 3 {
		t.Fatalf("cluster page shows %d members, want 3", n)
	}
	if got := b.lastCred(); got.Token != viewerToken {
		t.Fatalf("backend saw token %q, want the session's", got.Token)
	}

	// Logging out ends the session on the server, not only in the browser.
	old := c.http.Jar.Cookies(mustURL(t, c.srv.URL+"/ui/"))
	wantStatus(t, "logout", c.post("/ui/logout", url.Values{"csrf": {c.csrf()}}, c.srv.URL), http.StatusSeeOther)
	c2 := newTClient(t, c.srv)
	c2.http.Jar.SetCookies(mustURL(t, c.srv.URL+"/ui/"), old)
	if r := c2.get("/ui/"); r.code != http.StatusSeeOther {
		t.Fatalf("old session cookie after logout: status %d, want a redirect to login", r.code)
	}
}

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestWritesNeedCSRFAndSameOrigin(t *testing.T) {
	b := newFakeBackend(newFakeClock())
	c := newTestConsole(t, b, Options{})
	c.login(editorToken)
	def := "name: api\nalgorithm: TOKEN_BUCKET\nlimit: 50\nperiod: 1s\n"
	tok := c.csrf()
	for _, tc := range []struct {
		name   string
		form   url.Values
		origin string
		code   int
	}{
		{"no token", url.Values{"definition": {def}}, c.srv.URL, http.StatusForbidden},
		{"wrong token", url.Values{"definition": {def}, "csrf": {"x" + tok}}, c.srv.URL, http.StatusForbidden},
		{"other origin", url.Values{"definition": {def}, "csrf": {tok}}, "https://evil.example", http.StatusForbidden},
		{"good", url.Values{"definition": {def}, "csrf": {tok}}, c.srv.URL, http.StatusSeeOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.post("/ui/rules/api/edit", tc.form, tc.origin)
			if r.code != tc.code {
				t.Fatalf("status %d, want %d: %s", r.code, tc.code, r.body)
			}
		})
	}
	// Only the good write changed the rule: seeded at 1, now 3 (the fake
	// seeds two rules, so the write is index 3).
	if got := c.get("/ui/rules/api"); !strings.Contains(got.body, `<strong id="version">3</strong>`) || !strings.Contains(got.body, "Saved api: now version 3.") {
		t.Fatalf("rule page after one good write:\n%s", got.body)
	}
	if got := c.post("/ui/login", url.Values{"token": {editorToken}}, "https://evil.example"); got.code != http.StatusForbidden {
		t.Fatalf("cross-site login: status %d, want 403", got.code)
	}
}

func TestBackendErrorsShown(t *testing.T) {
	for _, tc := range []struct {
		name  string
		token string
		def   string
		ver   string
		code  int
		want  string
	}{
		{"viewer edits", viewerToken, "name: api\nlimit: 5\n", "", http.StatusForbidden,
			"You are a viewer: editing rules needs the editor role."},
		{"validation verbatim", editorToken, "name: api\nlimit: 0\n", "", http.StatusBadRequest,
			"rule &#34;api&#34;: limit must be &gt; 0 (got 0) &lt;at line 3&gt;"},
		{"stale version", editorToken, "name: api\nlimit: 5\n", "99", http.StatusConflict,
			"The rule changed since you opened it: rule &#34;api&#34; is at version 1, not 99"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestConsole(t, newFakeBackend(newFakeClock()), Options{})
			c.login(tc.token)
			r := c.post("/ui/rules/api/edit", url.Values{"definition": {tc.def}, "expected_version": {tc.ver}, "csrf": {c.csrf()}}, c.srv.URL)
			// The form comes back with the text as typed.
			wantStatus(t, tc.name, r, tc.code, tc.want, `aria-invalid="true"`, "limit:")
		})
	}
}

func TestRollbackAndDiff(t *testing.T) {
	b := newFakeBackend(newFakeClock())
	c := newTestConsole(t, b, Options{})
	c.login(editorToken)
	r := c.post("/ui/rules/api/edit", url.Values{"definition": {"name: api\nalgorithm: TOKEN_BUCKET\nlimit: 7\nperiod: 1s\n"},
		"expected_version": {"1"}, "csrf": {c.csrf()}}, c.srv.URL)
	wantStatus(t, "edit", r, http.StatusSeeOther)

	wantStatus(t, "diff", c.get("/ui/rules/api/diff?from=1&to=3"), http.StatusOK,
		`<span class="del">-limit: 100</span>`, `<span class="add">&#43;limit: 7</span>`)
	page := c.get("/ui/rules/api")
	wantStatus(t, "rule", page, http.StatusOK, "diff with 1", "roll back to 1", "user-1", "eddie")

	conf := c.get("/ui/rules/api/rollback?to=1")
	wantStatus(t, "confirm", conf, http.StatusOK, `<span class="add">&#43;limit: 100</span>`, `id="confirm"`)
	r = c.post("/ui/rules/api/rollback", url.Values{"to": {"1"}, "csrf": {c.csrf()}}, c.srv.URL)
	wantStatus(t, "rollback", r, http.StatusSeeOther)
	got := c.get("/ui/rules/api")
	wantStatus(t, "after rollback", got, http.StatusOK, "Rolled api back to version 1: now version 4.", "rollback to 1", "limit: 100")

	viewer := newTClient(t, c.srv)
	viewer.login(viewerToken)
	r = viewer.post("/ui/rules/api/rollback", url.Values{"to": {"3"}, "csrf": {viewer.csrf()}}, c.srv.URL)
	wantStatus(t, "viewer rollback", r, http.StatusForbidden, "You are a viewer: rolling back a rule needs the editor role.")
}

func TestSessionsExpireAndAreBounded(t *testing.T) {
	clock := newFakeClock()
	b := newFakeBackend(clock)
	srv := httptest.NewServer(New(b, Options{Now: clock.Now, SessionIdle: time.Minute, SessionMaxAge: time.Hour, MaxSessions: 2}))
	t.Cleanup(srv.Close)

	a := newTClient(t, srv)
	a.login(viewerToken)
	clock.Advance(59 * time.Second)
	wantStatus(t, "used within idle time", a.get("/ui/"), http.StatusOK)
	clock.Advance(61 * time.Second)
	if r := a.get("/ui/"); r.code != http.StatusSeeOther {
		t.Fatalf("idle session: status %d, want a redirect to login", r.code)
	}

	a.login(viewerToken)
	for range 80 { // used every 50 s, it still ends an hour after login
		clock.Advance(50 * time.Second)
		if a.get("/ui/").code != http.StatusOK {
			break
		}
	}
	if r := a.get("/ui/"); r.code != http.StatusSeeOther {
		t.Fatalf("session past its maximum age: status %d", r.code)
	}

	clients := make([]*tclient, 3)
	for i := range clients {
		clients[i] = newTClient(t, srv)
		clients[i].login(viewerToken)
		clock.Advance(time.Second)
	}
	if r := clients[0].get("/ui/"); r.code != http.StatusSeeOther {
		t.Fatalf("the least recently used session past the bound: status %d, want it ended", r.code)
	}
	for _, c := range clients[1:] {
		wantStatus(t, "newer session", c.get("/ui/"), http.StatusOK)
	}
}

func TestRevokedTokenEndsSession(t *testing.T) {
	b := newFakeBackend(newFakeClock())
	c := newTestConsole(t, b, Options{})
	c.login(viewerToken)
	b.revoke(viewerToken)
	r := c.get("/ui/rules")
	if r.code != http.StatusSeeOther || !strings.Contains(r.location, "reason=expired") {
		t.Fatalf("revoked token: %d to %q, want the login form", r.code, r.location)
	}
	if r := c.get("/ui/login?reason=expired"); !strings.Contains(r.body, "Your session ended.") {
		t.Fatalf("login after expiry:\n%s", r.body)
	}
}

func TestNoAuthLoopback(t *testing.T) {
	b := newFakeBackend(newFakeClock())
	b.loopbackOpen = true
	c := newTestConsole(t, b, Options{NoAuth: true})
	r := c.get("/ui/")
	wantStatus(t, "no-auth cluster", r, http.StatusOK, "node-3", "local (no auth)")
	if strings.Contains(r.body, "Sign out") {
		t.Fatal("a no-auth console offers to sign out")
	}
	// Writes still need the session's CSRF token.
	def := url.Values{"definition": {"name: api\nlimit: 9\n"}}
	wantStatus(t, "write without CSRF", c.post("/ui/rules/api/edit", def, c.srv.URL), http.StatusForbidden)
	def.Set("csrf", c.csrf())
	wantStatus(t, "write with CSRF", c.post("/ui/rules/api/edit", def, c.srv.URL), http.StatusSeeOther)

	// The Backend still decides: a node that refuses the caller shows
	// the login form.
	b.loopbackOpen = false
	if r := newTClient(t, c.srv).get("/ui/"); r.code != http.StatusSeeOther {
		t.Fatalf("refused no-auth caller: status %d", r.code)
	}
}

// selfSigned returns a certificate with common name cn.
func selfSigned(t *testing.T, cn string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestClientCertificate(t *testing.T) {
	b := newFakeBackend(newFakeClock())
	h := New(b, Options{})
	ops, other := selfSigned(t, "ops-cert"), selfSigned(t, "stranger")

	req := httptest.NewRequest(http.MethodGet, "https://node/ui/", nil)
	req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{ops}}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "ops-cert (viewer)") {
		t.Fatalf("certificate caller: status %d:\n%s", w.Code, w.Body)
	}
	if got := b.lastCred(); got.TLS == nil || got.TLS.PeerCertificates[0] != ops {
		t.Fatal("the backend did not get the request's TLS state")
	}
	ck := w.Result().Cookies()
	if len(ck) != 1 || !ck[0].Secure {
		t.Fatalf("cookies over TLS %+v: want one Secure session cookie", ck)
	}

	// The session is bound to the certificate that opened it.
	req = httptest.NewRequest(http.MethodGet, "https://node/ui/", nil)
	req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{other}}
	req.AddCookie(ck[0])
	w = httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusSeeOther {
		t.Fatalf("another certificate with the session cookie: status %d, want the login form", w.Code)
	}
}

func TestAPI(t *testing.T) {
	clock := newFakeClock()
	b := newFakeBackend(clock)
	c := newTestConsole(t, b, Options{Now: clock.Now})
	r := c.get("/ui/api/rules")
	if r.code != http.StatusUnauthorized || !strings.Contains(r.body, `"code":"Unauthenticated"`) {
		t.Fatalf("API without a session: %d %s", r.code, r.body)
	}
	c.login(viewerToken)
	for i := range 5 {
		b.advance("api", int64(10*i), int64(i))
	}
	var s apiSeriesResp
	decode(t, c.get("/ui/api/rules/api/series"), &s)
	if len(s.T) != 5 || s.Admitted[4] != 40 || s.Denied[4] != 4 || s.T[4] != clock.Now().Unix()-1 {
		t.Fatalf("series %+v, want the five points, newest last", s)
	}
	var rules struct{ Rules []apiRule }
	decode(t, c.get("/ui/api/rules"), &rules)
	if len(rules.Rules) != 2 || len(rules.Rules[0].Spark) != 60 {
		t.Fatalf("rules %+v", rules)
	}
	var top struct{ Keys []apiTopKey }
	decode(t, c.get("/ui/api/rules/api/top?denied=true&window=1h"), &top)
	if len(top.Keys) != 1 || top.Keys[0] != (apiTopKey{Key: "user-1", Count: 77, ErrorBound: 1}) {
		t.Fatalf("top denied %+v", top)
	}
	if r := c.get("/ui/api/rules/nope/series?seconds=0"); r.code != http.StatusBadRequest {
		t.Fatalf("bad seconds: %d", r.code)
	}
}

func decode(t *testing.T, r resp, v any) {
	t.Helper()
	if r.code != http.StatusOK {
		t.Fatalf("status %d: %s", r.code, r.body)
	}
	if err := json.Unmarshal([]byte(r.body), v); err != nil {
		t.Fatal(err)
	}
}

func TestOptionalPages(t *testing.T) {
	plain := newTestConsole(t, newFakeBackend(newFakeClock()), Options{})
	plain.login(viewerToken)
	if r := plain.get("/ui/rules"); strings.Contains(r.body, "/ui/overrides") || strings.Contains(r.body, "/ui/envoy") {
		t.Fatal("nav links to pages the backend does not support")
	}
	if r := plain.get("/ui/overrides"); r.code != http.StatusNotFound {
		t.Fatalf("unsupported overrides page: %d", r.code)
	}
	full := newTestConsole(t, fakeFullBackend{newFakeBackend(newFakeClock())}, Options{})
	full.login(viewerToken)
	wantStatus(t, "overrides", full.get("/ui/overrides"), http.StatusOK, "vip-*", "1000/1s")
	wantStatus(t, "envoy", full.get("/ui/envoy"), http.StatusOK, "edge", "2 descriptors", "History of edge (2 versions)", "file:edge.yaml", "SYNC", "alice")
}

func TestEveryPageRendersWithoutTokenOrExternalURL(t *testing.T) {
	c := newTestConsole(t, fakeFullBackend{newFakeBackend(newFakeClock())}, Options{})
	c.login(editorToken)
	external := regexp.MustCompile(`(?i)(src|href)="(https?:)?//`)
	live := regexp.MustCompile(`data-(?:api|refresh)="([^"]+)"`)
	for _, p := range []string{"/ui/", "/ui/rules", "/ui/rules/api", "/ui/rules/api/edit", "/ui/new-rule", "/ui/rules/api/diff?from=1&to=1",
		"/ui/rules/api/rollback?to=1", "/ui/overrides", "/ui/envoy", "/ui/part/members", "/ui/part/rules/api/top", "/ui/part/rules/api/bound", "/ui/login"} {
		r := c.get(p)
		if r.code != http.StatusOK && r.code != http.StatusSeeOther {
			t.Fatalf("%s: status %d", p, r.code)
		}
		if external.MatchString(r.body) {
			t.Fatalf("%s loads something from another host", p)
		}
		for _, m := range live.FindAllStringSubmatch(r.body, -1) {
			u := strings.ReplaceAll(m[1], "&amp;", "&")
			if got := c.get(u); got.code != http.StatusOK {
				t.Fatalf("%s polls %s, which answers %d", p, u, got.code)
			}
		}
	}
	wantStatus(t, "unknown rule", c.get("/ui/rules/nope"), http.StatusNotFound, `rule &#34;nope&#34; not found`)
	for _, a := range []string{"console.js", "console.css", "vendor/uplot/uPlot.iife.min.js", "vendor/uplot/LICENSE"} {
		wantStatus(t, a, c.get("/ui/assets/"+a), http.StatusOK)
	}
}

// BenchmarkRulesPage1000 measures the server side of the Rules page with
// 1,000 rules (the fake backend's own cost included).
func BenchmarkRulesPage1000(b *testing.B) {
	fb := newFakeBackend(newFakeClock())
	fb.addRules(998)
	h := New(fb, Options{})
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	c := newTClient(b, srv)
	c.login(viewerToken)
	cookies := c.http.Jar.Cookies(mustURL(b, srv.URL+"/ui/"))
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodGet, "/ui/rules", nil)
		req.AddCookie(cookies[0])
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d", w.Code)
		}
		b.ReportMetric(float64(w.Body.Len()), "bytes/page")
	}
}

// TestOverrideEdit: a viewer reads overrides and gets no form, and a
// posted change is refused; an editor sees the API's validation message
// with the form as typed, saves an override and deletes it.
func TestOverrideEdit(t *testing.T) {
	back := fakeFullBackend{newFakeBackend(newFakeClock())}
	viewer := newTestConsole(t, back, Options{})
	viewer.login(viewerToken)
	r := viewer.get("/ui/overrides")
	wantStatus(t, "viewer overrides", r, http.StatusOK, "vip-*", "Viewers read overrides")
	if strings.Contains(r.body, `id="override-form"`) {
		t.Fatal("a viewer gets the override form")
	}
	form := url.Values{"csrf": {viewer.csrf()}, "rule": {"api"}, "key": {"gold"}, "limit": {"50"}}
	wantStatus(t, "viewer put", viewer.post("/ui/overrides", form, viewer.srv.URL), http.StatusForbidden, "editor")

	editor := newTestConsole(t, back, Options{})
	editor.login(editorToken)
	wantStatus(t, "editor overrides", editor.get("/ui/overrides"), http.StatusOK, `id="override-form"`)
	tests := []struct {
		name  string
		form  url.Values
		code  int
		shows []string
	}{
		{"not a number", url.Values{"rule": {"api"}, "key": {"gold"}, "limit": {"lots"}}, http.StatusBadRequest, []string{"limit &#34;lots&#34; is not a whole number", `value="gold"`}},
		{"the API refuses", url.Values{"rule": {"api"}, "key": {"gold"}, "limit": {"-5"}}, http.StatusBadRequest, []string{"override limit must be positive, got -5", `value="-5"`}},
		{"bad expiry", url.Values{"rule": {"api"}, "key": {"gold"}, "limit": {"5"}, "expires": {"soon"}}, http.StatusBadRequest, []string{"neither a duration"}},
		{"saved", url.Values{"rule": {"api"}, "key": {"gold"}, "limit": {"50"}, "expires": {"1h"}}, http.StatusSeeOther, nil},
	}
	for _, tt := range tests {
		tt.form.Set("csrf", editor.csrf())
		wantStatus(t, tt.name, editor.post("/ui/overrides", tt.form, editor.srv.URL), tt.code, tt.shows...)
	}
	wantStatus(t, "after save", editor.get("/ui/overrides"), http.StatusOK, "Saved the override of api for gold", "<code>gold</code>")
	del := url.Values{"csrf": {editor.csrf()}, "rule": {"api"}, "key": {"gold"}}
	wantStatus(t, "delete", editor.post("/ui/overrides/delete", del, editor.srv.URL), http.StatusSeeOther)
	if r := editor.get("/ui/overrides"); strings.Contains(r.body, "<code>gold</code>") {
		t.Fatal("override still listed after delete")
	}
}

// TestRuleBoundAndCost: the rule page shows the bound per node and part,
// summed, with the members that did not answer; a viewer reads the cost
// fields and cannot post them; an editor sees the API's message with the
// form as typed, and saves.
func TestRuleBoundAndCost(t *testing.T) {
	back := fakeFullBackend{newFakeBackend(newFakeClock())}
	viewer := newTestConsole(t, back, Options{})
	viewer.login(viewerToken)
	r := viewer.get("/ui/rules/api")
	wantStatus(t, "viewer rule", r, http.StatusOK, "Over-admission bound", `id="bound-total">321<`, "unplanned_fresh", "replication_lag",
		"not answering: m3", "2026-03-01 12:00:00Z (42 buckets)", `<th scope="row">Cluster</th><td class="num">300</td>`, `id="cost"`, "no inline limits")
	if strings.Contains(r.body, `id="cost-form"`) {
		t.Fatal("a viewer gets the cost form")
	}
	wantStatus(t, "bound part", viewer.get("/ui/part/rules/api/bound"), http.StatusOK, `id="bound-total">321<`)
	form := url.Values{"csrf": {viewer.csrf()}, "time_zone": {"UTC"}}
	wantStatus(t, "viewer cost", viewer.post("/ui/rules/api/cost", form, viewer.srv.URL), http.StatusForbidden, "editor")

	editor := newTestConsole(t, back, Options{})
	editor.login(editorToken)
	wantStatus(t, "editor rule", editor.get("/ui/rules/api"), http.StatusOK, `id="cost-form"`, `for="c-calendar"`, `for="c-durable"`)
	tests := []struct {
		name  string
		form  url.Values
		code  int
		shows []string
	}{
		{"bad calendar", url.Values{"calendar": {"YEAR"}}, http.StatusBadRequest, []string{"calendar &#34;YEAR&#34; is not DAY, WEEK or MONTH"}},
		{"bad duration", url.Values{"reservation_ttl": {"soon"}}, http.StatusBadRequest, []string{"reservation TTL &#34;soon&#34; is not a duration"}},
		{"the API refuses", url.Values{"calendar": {"DAY"}, "time_zone": {"Mars/Olympus"}}, http.StatusBadRequest,
			[]string{"time_zone &#34;Mars/Olympus&#34;: unknown time zone", `value="Mars/Olympus"`, `<option value="DAY" selected>`}},
		{"stale version", url.Values{"expected_version": {"99"}}, http.StatusConflict, []string{"not 99"}},
		{"saved", url.Values{"calendar": {"DAY"}, "time_zone": {"Europe/Paris"}, "inline_max_limit": {"500"}, "inline_max_period": {"1h"},
			"reservation_ttl": {"30s"}, "durable": {"on"}}, http.StatusSeeOther, nil},
	}
	for _, tt := range tests {
		tt.form.Set("csrf", editor.csrf())
		wantStatus(t, tt.name, editor.post("/ui/rules/api/cost", tt.form, editor.srv.URL), tt.code, tt.shows...)
	}
	wantStatus(t, "after save", editor.get("/ui/rules/api"), http.StatusOK, "Saved the cost fields of api", `value="Europe/Paris"`,
		`value="500"`, `value="1h0m0s"`, `value="30s"`, `id="c-durable" name="durable" value="on" checked`, `id="durable-tag"`, "Durable: buckets are replicated")
	rules := editor.get("/ui/rules")
	wantStatus(t, "rules list", rules, http.StatusOK, `<a href="/ui/rules/api">api</a> <span class="tag durable">durable</span>`, `<td class="num" data-f="3">11</td>`)
	if strings.Count(rules.body, `class="tag durable"`) != 1 {
		t.Fatal("the rules list marks a rule durable that is not")
	}
	wantStatus(t, "rules API", editor.get("/ui/api/rules"), http.StatusOK, `"bound":11`)
}
