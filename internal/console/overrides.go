package console

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// overridesData is the Overrides page: the list, and for an editor the
// form (as typed, with the server's message after a failed save).
type overridesData struct {
	Rule    string // the rule filter, "" for every rule
	List    []Override
	CanEdit bool
	Form    overrideForm
	Error   string
	ListErr string
}

// overrideForm is the override form's fields as typed.
type overrideForm struct {
	Rule, Key, Limit, Burst, Expires string
}

func (h *handler) overridesData(r *request) overridesData {
	_, editable := h.backend.(OverrideEditor)
	d := overridesData{Rule: r.URL.Query().Get("rule")}
	d.CanEdit = editable && (hasRole(r.sess.principal, "editor") || hasRole(r.sess.principal, "admin"))
	d.Form.Rule = d.Rule
	return d
}

func hasRole(p Principal, role string) bool {
	for _, r := range p.Roles {
		if r == role {
			return true
		}
	}
	return false
}

func (h *handler) overridesPage(w http.ResponseWriter, r *request) {
	d := h.overridesData(r)
	ctx, cancel := h.call(r)
	defer cancel()
	list, err := h.backend.(OverrideLister).ListOverrides(ctx, r.cred, d.Rule)
	if err != nil {
		h.fail(w, r, err, actRead)
		return
	}
	d.List = list
	h.show(w, r, http.StatusOK, "overrides", "Overrides", "overrides", d)
}

// parseOverride reads the form. Expires is a duration from now ("1h") or
// an RFC 3339 time; empty means never.
func parseOverride(f overrideForm, now time.Time) (Override, error) {
	o := Override{Rule: strings.TrimSpace(f.Rule), Key: f.Key}
	var err error
	if o.Limit, err = strconv.ParseInt(strings.TrimSpace(f.Limit), 10, 64); err != nil {
		return o, status.Errorf(codes.InvalidArgument, "limit %q is not a whole number", f.Limit)
	}
	if b := strings.TrimSpace(f.Burst); b != "" {
		if o.Burst, err = strconv.ParseInt(b, 10, 64); err != nil {
			return o, status.Errorf(codes.InvalidArgument, "burst %q is not a whole number", f.Burst)
		}
	}
	e := strings.TrimSpace(f.Expires)
	if e == "" {
		return o, nil
	}
	if d, derr := time.ParseDuration(e); derr == nil {
		if d <= 0 {
			return o, status.Errorf(codes.InvalidArgument, "expires %q must be in the future", e)
		}
		o.Expires = now.Add(d)
		return o, nil
	}
	t, terr := time.Parse(time.RFC3339, e)
	if terr != nil {
		return o, status.Errorf(codes.InvalidArgument, "expires %q is neither a duration (1h30m) nor an RFC 3339 time", e)
	}
	o.Expires = t
	return o, nil
}

// putOverride saves an override; on error the page comes back with the
// form as typed and the server's message verbatim.
func (h *handler) putOverride(w http.ResponseWriter, r *request) {
	d := h.overridesData(r)
	d.Form = overrideForm{Rule: r.PostFormValue("rule"), Key: r.PostFormValue("key"), Limit: r.PostFormValue("limit"),
		Burst: r.PostFormValue("burst"), Expires: r.PostFormValue("expires")}
	ctx, cancel := h.call(r)
	defer cancel()
	o, err := parseOverride(d.Form, h.opts.Now())
	if err == nil {
		o, err = h.backend.(OverrideEditor).PutOverride(ctx, r.cred, o)
	}
	if err != nil {
		if status.Code(err) == codes.Unauthenticated {
			h.fail(w, r, err, actOverride)
			return
		}
		var code int
		code, d.Error = errorMessage(err, r.sess.principal, actOverride)
		if d.List, err = h.backend.(OverrideLister).ListOverrides(ctx, r.cred, d.Rule); err != nil {
			_, d.ListErr = errorMessage(err, r.sess.principal, actRead)
		}
		h.show(w, r, code, "overrides", "Overrides", "overrides", d)
		return
	}
	h.sessions.setFlash(r.sess, fmt.Sprintf("Saved the override of %s for %s: version %d.", o.Rule, o.Key, o.Version))
	http.Redirect(w, r.Request, "/ui/overrides", http.StatusSeeOther)
}

func (h *handler) deleteOverride(w http.ResponseWriter, r *request) {
	rule, key := r.PostFormValue("rule"), r.PostFormValue("key")
	ctx, cancel := h.call(r)
	defer cancel()
	if err := h.backend.(OverrideEditor).DeleteOverride(ctx, r.cred, rule, key); err != nil {
		h.fail(w, r, err, actOverride)
		return
	}
	h.sessions.setFlash(r.sess, fmt.Sprintf("Deleted the override of %s for %s.", rule, key))
	http.Redirect(w, r.Request, "/ui/overrides", http.StatusSeeOther)
}
