package console

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pmezard/go-difflib/difflib"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// view is what every page template receives.
type view struct {
	Title string
	Nav   string
	// User is the signed-in principal; Role its highest role.
	User     Principal
	Role     string
	SignedIn bool
	NoAuth   bool
	CSRF     string
	Flash    string
	// Overrides and Envoy say whether the Backend supports those pages.
	Overrides, Envoy bool
	Data             any
}

func (h *handler) view(r *request, title, nav string, data any) view {
	v := view{Title: title, Nav: nav, NoAuth: h.opts.NoAuth, Data: data}
	_, v.Overrides = h.backend.(OverrideLister)
	_, v.Envoy = h.backend.(EnvoyDomainLister)
	if r != nil {
		v.SignedIn = true
		v.User = r.sess.principal
		v.Role = topRole(r.sess.principal)
		v.CSRF = r.sess.csrf
		v.Flash = h.sessions.takeFlash(r.sess)
	}
	return v
}

func (h *handler) show(w http.ResponseWriter, r *request, code int, page, title, nav string, data any) {
	h.pages.render(w, code, page, "layout", h.view(r, title, nav, data))
}

// errorPage shows msg with the HTTP status code; r may be nil.
func (h *handler) errorPage(w http.ResponseWriter, r *request, code int, msg string) {
	h.show(w, r, code, "error", http.StatusText(code), "", msg)
}

type loginData struct {
	Next, Error string
}

func (h *handler) loginPage(w http.ResponseWriter, hr *http.Request) {
	if _, ok := h.authenticate(w, hr); ok {
		http.Redirect(w, hr, safeNext(hr.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	d := loginData{Next: safeNext(hr.URL.Query().Get("next"))}
	if hr.URL.Query().Get("reason") == "expired" {
		d.Error = "Your session ended. Sign in again."
	}
	h.show(w, nil, http.StatusOK, "login", "Sign in", "", d)
}

// login checks the posted token with the Backend and opens a session
// holding it. The token is never echoed back.
func (h *handler) login(w http.ResponseWriter, hr *http.Request) {
	if !sameOrigin(hr) {
		h.errorPage(w, nil, http.StatusForbidden, "This request came from another site and was refused.")
		return
	}
	next := safeNext(hr.PostFormValue("next"))
	token := strings.TrimSpace(hr.PostFormValue("token"))
	if token == "" {
		h.show(w, nil, http.StatusBadRequest, "login", "Sign in", "", loginData{Next: next, Error: "Enter a token."})
		return
	}
	ctx, cancel := context.WithTimeout(hr.Context(), h.opts.BackendTimeout)
	defer cancel()
	p, err := h.backend.WhoAmI(ctx, Credential{Token: token, TLS: hr.TLS, RemoteAddr: hr.RemoteAddr})
	if err != nil {
		msg := "That token was not accepted."
		if c := status.Code(err); c != codes.Unauthenticated && c != codes.PermissionDenied {
			_, msg = errorMessage(err, Principal{}, actRead)
		}
		h.show(w, nil, http.StatusUnauthorized, "login", "Sign in", "", loginData{Next: next, Error: msg})
		return
	}
	if c, err := hr.Cookie(cookieName); err == nil {
		h.sessions.delete(c.Value)
	}
	sess := h.sessions.create(token, [32]byte{}, p)
	h.setCookie(w, hr, sess.id, 0)
	h.opts.Logger.Info("console: signed in", "principal", p.Name, "remote", hr.RemoteAddr)
	http.Redirect(w, hr, next, http.StatusSeeOther)
}

func (h *handler) logout(w http.ResponseWriter, r *request) {
	h.sessions.delete(r.sess.id)
	h.setCookie(w, r.Request, "", -1)
	http.Redirect(w, r.Request, "/ui/login", http.StatusSeeOther)
}

func (h *handler) clusterPage(w http.ResponseWriter, r *request) {
	ctx, cancel := h.call(r)
	defer cancel()
	c, err := h.backend.ClusterStatus(ctx, r.cred)
	if err != nil {
		h.fail(w, r, err, actRead)
		return
	}
	h.show(w, r, http.StatusOK, "cluster", "Cluster", "cluster", c)
}

func (h *handler) membersPart(w http.ResponseWriter, r *request) {
	ctx, cancel := h.call(r)
	defer cancel()
	c, err := h.backend.ClusterStatus(ctx, r.cred)
	if err != nil {
		code, msg := errorMessage(err, r.sess.principal, actRead)
		http.Error(w, msg, code)
		return
	}
	h.pages.render(w, http.StatusOK, "cluster", "members", c)
}

func (h *handler) rulesPage(w http.ResponseWriter, r *request) {
	ctx, cancel := h.call(r)
	defer cancel()
	rules, err := h.backend.ListRules(ctx, r.cred)
	if err != nil {
		h.fail(w, r, err, actRead)
		return
	}
	h.show(w, r, http.StatusOK, "rules", "Rules", "rules", rules)
}

// ruleData is the rule page's content.
type ruleData struct {
	Rule    Rule
	Window  string
	Top     topData
	History []RuleVersion
	// HistoryErr is shown in place of the history when it failed.
	HistoryErr string
	// Bound is the over-admission bound (nil: the Backend has none).
	Bound *boundData
	// CostForm is the cost fields, as stored or as typed after a failed
	// save (with CostErr, the server's message); CanEditCost shows the
	// form rather than the values.
	CostForm    costForm
	CostErr     string
	CanEditCost bool
}

type topData struct {
	Rule              string
	Window            string
	Admitted, Denied  []TopKey
	AdmittedErr, DErr string
}

// windows are the top-key windows offered.
var windows = map[string]time.Duration{"1m": time.Minute, "1h": time.Hour}

func (h *handler) topKeys(ctx context.Context, r *request, name, window string) topData {
	d := topData{Rule: name, Window: window}
	var err error
	d.Admitted, err = h.backend.TopKeys(ctx, r.cred, name, 10, windows[window], false)
	if err != nil {
		_, d.AdmittedErr = errorMessage(err, r.sess.principal, actRead)
	}
	d.Denied, err = h.backend.TopKeys(ctx, r.cred, name, 10, windows[window], true)
	if err != nil {
		_, d.DErr = errorMessage(err, r.sess.principal, actRead)
	}
	return d
}

func windowParam(r *request) string {
	if w := r.URL.Query().Get("window"); windows[w] != 0 {
		return w
	}
	return "1m"
}

func (h *handler) rulePage(w http.ResponseWriter, r *request) {
	ctx, cancel := h.call(r)
	defer cancel()
	h.showRule(ctx, w, r, r.PathValue("name"), http.StatusOK, nil, "")
}

// showRule renders the rule page with code; form and costErr, when set,
// are a cost form as typed and the message its save failed with.
func (h *handler) showRule(ctx context.Context, w http.ResponseWriter, r *request, name string, code int, form *costForm, costErr string) {
	rule, err := h.backend.GetRule(ctx, r.cred, name)
	if err != nil {
		h.fail(w, r, err, actRead)
		return
	}
	d := ruleData{Rule: rule, Window: windowParam(r), CostForm: formOf(rule.Cost), CostErr: costErr}
	if form != nil {
		d.CostForm = *form
	}
	_, editor := h.backend.(CostEditor)
	d.CanEditCost = editor && canEdit(r.sess.principal)
	d.Top = h.topKeys(ctx, r, name, d.Window)
	d.Bound = h.ruleBound(ctx, r, name, rule.Cost.Durable)
	d.History, err = h.backend.RuleHistory(ctx, r.cred, name)
	if err != nil {
		_, d.HistoryErr = errorMessage(err, r.sess.principal, actRead)
	}
	h.show(w, r, code, "rule", "Rule "+name, "rules", d)
}

func (h *handler) topPart(w http.ResponseWriter, r *request) {
	ctx, cancel := h.call(r)
	defer cancel()
	h.pages.render(w, http.StatusOK, "rule", "topkeys", h.topKeys(ctx, r, r.PathValue("name"), windowParam(r)))
}

// editData is the edit form's content.
type editData struct {
	Name            string // "" for a new rule
	Definition      string
	ExpectedVersion uint64
	Error           string
}

const newRuleExample = `name: my-rule
algorithm: TOKEN_BUCKET
limit: 100
period: 1s
`

func (h *handler) editPage(w http.ResponseWriter, r *request) {
	name := r.PathValue("name")
	d := editData{Name: name, Definition: newRuleExample}
	if name != "" {
		ctx, cancel := h.call(r)
		defer cancel()
		rule, err := h.backend.GetRule(ctx, r.cred, name)
		if err != nil {
			h.fail(w, r, err, actRead)
			return
		}
		d.Definition, d.ExpectedVersion = rule.Definition, rule.Version
	}
	h.show(w, r, http.StatusOK, "edit", editTitle(name), "rules", d)
}

func editTitle(name string) string {
	if name == "" {
		return "New rule"
	}
	return "Edit " + name
}

// editRule saves a rule; on error the form comes back with the text as
// typed and the server's message verbatim.
func (h *handler) editRule(w http.ResponseWriter, r *request) {
	d := editData{Name: r.PathValue("name"), Definition: r.PostFormValue("definition")}
	if v := r.PostFormValue("expected_version"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			h.errorPage(w, r, http.StatusBadRequest, "expected_version is not a number")
			return
		}
		d.ExpectedVersion = n
	}
	ctx, cancel := h.call(r)
	defer cancel()
	saved, err := h.backend.PutRule(ctx, r.cred, d.Definition, d.ExpectedVersion)
	if err != nil {
		if status.Code(err) == codes.Unauthenticated {
			h.fail(w, r, err, actEdit)
			return
		}
		var code int
		code, d.Error = errorMessage(err, r.sess.principal, actEdit)
		h.show(w, r, code, "edit", editTitle(d.Name), "rules", d)
		return
	}
	h.sessions.setFlash(r.sess, fmt.Sprintf("Saved %s: now version %d.", saved.Name, saved.Version))
	http.Redirect(w, r.Request, ruleURL(saved.Name), http.StatusSeeOther)
}

// diffLine is one line of a unified diff, with its kind for styling.
type diffLine struct {
	Kind string // "add", "del", "hunk", "ctx"
	Text string
}

func unifiedDiff(a, b, aName, bName string) []diffLine {
	text, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: difflib.SplitLines(a), B: difflib.SplitLines(b), FromFile: aName, ToFile: bName, Context: 3,
	})
	if err != nil {
		return []diffLine{{Kind: "ctx", Text: "diff failed: " + err.Error()}}
	}
	var out []diffLine
	for _, l := range strings.SplitAfter(text, "\n") {
		if l == "" {
			continue
		}
		l = strings.TrimSuffix(l, "\n")
		k := "ctx"
		switch {
		case strings.HasPrefix(l, "+++"), strings.HasPrefix(l, "---"), strings.HasPrefix(l, "@@"):
			k = "hunk"
		case strings.HasPrefix(l, "+"):
			k = "add"
		case strings.HasPrefix(l, "-"):
			k = "del"
		}
		out = append(out, diffLine{Kind: k, Text: l})
	}
	return out
}

// diffData is a diff page's (and a rollback confirmation's) content.
type diffData struct {
	Name     string
	From, To uint64
	Lines    []diffLine
}

// findVersion returns version v of the history.
func findVersion(hist []RuleVersion, v uint64) (RuleVersion, bool) {
	for _, x := range hist {
		if x.Version == v {
			return x, true
		}
	}
	return RuleVersion{}, false
}

// versionsDiff diffs two versions of name, as history holds them.
func (h *handler) versionsDiff(ctx context.Context, r *request, name string, from, to uint64) (diffData, error) {
	hist, err := h.backend.RuleHistory(ctx, r.cred, name)
	if err != nil {
		return diffData{}, err
	}
	a, okA := findVersion(hist, from)
	b, okB := findVersion(hist, to)
	if !okA || !okB {
		return diffData{}, status.Errorf(codes.NotFound, "rule %q has no version %d or %d in its history", name, from, to)
	}
	return diffData{Name: name, From: from, To: to,
		Lines: unifiedDiff(a.Definition, b.Definition, fmt.Sprintf("version %d", from), fmt.Sprintf("version %d", to))}, nil
}

func versionParam(r *request, key string) (uint64, bool) {
	v, err := strconv.ParseUint(r.FormValue(key), 10, 64)
	return v, err == nil
}

func (h *handler) diffPage(w http.ResponseWriter, r *request) {
	from, ok1 := versionParam(r, "from")
	to, ok2 := versionParam(r, "to")
	if !ok1 || !ok2 {
		h.errorPage(w, r, http.StatusBadRequest, "from and to must be version numbers")
		return
	}
	ctx, cancel := h.call(r)
	defer cancel()
	d, err := h.versionsDiff(ctx, r, r.PathValue("name"), from, to)
	if err != nil {
		h.fail(w, r, err, actRead)
		return
	}
	h.show(w, r, http.StatusOK, "diff", "Diff", "rules", d)
}

// rollbackPage asks for confirmation, showing what the rollback changes.
func (h *handler) rollbackPage(w http.ResponseWriter, r *request) {
	to, ok := versionParam(r, "to")
	if !ok {
		h.errorPage(w, r, http.StatusBadRequest, "to must be a version number")
		return
	}
	name := r.PathValue("name")
	ctx, cancel := h.call(r)
	defer cancel()
	cur, err := h.backend.GetRule(ctx, r.cred, name)
	if err != nil {
		h.fail(w, r, err, actRead)
		return
	}
	d, err := h.versionsDiff(ctx, r, name, cur.Version, to)
	if err != nil {
		h.fail(w, r, err, actRead)
		return
	}
	h.show(w, r, http.StatusOK, "rollback", "Roll back "+name, "rules", d)
}

func (h *handler) rollback(w http.ResponseWriter, r *request) {
	to, ok := versionParam(r, "to")
	if !ok {
		h.errorPage(w, r, http.StatusBadRequest, "to must be a version number")
		return
	}
	name := r.PathValue("name")
	ctx, cancel := h.call(r)
	defer cancel()
	v, err := h.backend.RollbackRule(ctx, r.cred, name, to)
	if err != nil {
		h.fail(w, r, err, actRollback)
		return
	}
	h.sessions.setFlash(r.sess, fmt.Sprintf("Rolled %s back to version %d: now version %d.", name, to, v))
	http.Redirect(w, r.Request, ruleURL(name), http.StatusSeeOther)
}

func (h *handler) envoyPage(w http.ResponseWriter, r *request) {
	ctx, cancel := h.call(r)
	defer cancel()
	list, err := h.backend.(EnvoyDomainLister).ListEnvoyDomains(ctx, r.cred)
	if err != nil {
		h.fail(w, r, err, actRead)
		return
	}
	h.show(w, r, http.StatusOK, "envoy", "Envoy domains", "envoy", list)
}
