package console

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The rule page's over-admission bound and its cost fields.

// Cost is a rule's cost and durability fields, as the rule page edits
// them apart from the whole definition.
type Cost struct {
	// Calendar is "" (none), "DAY", "WEEK" or "MONTH": fixed windows
	// aligned to local calendar boundaries in TimeZone.
	Calendar string
	// TimeZone is the IANA zone of calendar windows ("": UTC).
	TimeZone string
	// InlineMaxLimit and InlineMaxPeriod cap the limits requests may carry
	// (both 0: requests carry none).
	InlineMaxLimit  int64
	InlineMaxPeriod time.Duration
	// ReservationTTL is how long a reservation waits for its commit (0:
	// the rule's period).
	ReservationTTL time.Duration
	// Durable replicates and checkpoints the rule's buckets.
	Durable bool
}

// BoundPart is one named part of an over-admission bound.
type BoundPart struct {
	Name    string
	Permits int64
}

// NodeBound is one node's over-admission bound for a rule.
type NodeBound struct {
	Node string
	// Permits is the sum of Parts.
	Permits int64
	Parts   []BoundPart
	// Checkpoint is when the node last wrote its durable buckets to its
	// data dir (zero: never), CheckpointBuckets how many it wrote.
	Checkpoint        time.Time
	CheckpointBuckets int64
}

// RuleBound is a rule's over-admission bound on every node.
type RuleBound struct {
	Durable bool
	Nodes   []NodeBound
	// Missing names the nodes that did not answer.
	Missing []string
}

// Total is the bound summed over the nodes that answered.
func (b RuleBound) Total() int64 {
	var t int64
	for _, n := range b.Nodes {
		t += n.Permits
	}
	return t
}

// PartNames are the parts' names in the order the nodes give them.
func (b RuleBound) PartNames() []string {
	var out []string
	seen := map[string]bool{}
	for _, n := range b.Nodes {
		for _, p := range n.Parts {
			if !seen[p.Name] {
				seen[p.Name] = true
				out = append(out, p.Name)
			}
		}
	}
	return out
}

// PartTotals are the parts summed over the nodes, in PartNames' order.
func (b RuleBound) PartTotals() []int64 {
	names := b.PartNames()
	out := make([]int64, len(names))
	for _, n := range b.Nodes {
		for _, p := range n.Parts {
			for i, name := range names {
				if name == p.Name {
					out[i] += p.Permits
				}
			}
		}
	}
	return out
}

// PartTotal is the part named name summed over the nodes.
func (b RuleBound) PartTotal(name string) int64 {
	var t int64
	for _, n := range b.Nodes {
		t += n.Part(name)
	}
	return t
}

// Part is n's permits for the part named name (0 when it has none).
func (n NodeBound) Part(name string) int64 {
	for _, p := range n.Parts {
		if p.Name == name {
			return p.Permits
		}
	}
	return 0
}

// BoundReader is implemented by a Backend whose nodes export the
// over-admission bound; the rule page then shows it.
type BoundReader interface {
	// RuleBound returns rule's bound on every node.
	RuleBound(ctx context.Context, c Credential, rule string) (RuleBound, error)
}

// CostEditor is implemented by a Backend that changes a rule's cost
// fields alone (editors only; the Backend authorizes). An invalid value
// fails with InvalidArgument and the API's message; a rule changed since
// expectedVersion (0: any) with FailedPrecondition.
type CostEditor interface {
	PutRuleCost(ctx context.Context, c Credential, rule string, cost Cost, expectedVersion uint64) (Rule, error)
}

// boundData is the bound fragment of the rule page.
type boundData struct {
	Rule  string
	Bound RuleBound
	Err   string
}

// ruleBound is the bound fragment of rule name; durable is the rule's
// flag as GetRule read it (through the leader), newer right after a save
// than the answering node's table, which RuleBound reads.
func (h *handler) ruleBound(ctx context.Context, r *request, name string, durable bool) *boundData {
	br, ok := h.backend.(BoundReader)
	if !ok {
		return nil
	}
	d := &boundData{Rule: name}
	var err error
	if d.Bound, err = br.RuleBound(ctx, r.cred, name); err != nil {
		_, d.Err = errorMessage(err, r.sess.principal, actRead)
	}
	d.Bound.Durable = durable
	return d
}

func (h *handler) boundPart(w http.ResponseWriter, r *request) {
	ctx, cancel := h.call(r)
	defer cancel()
	name := r.PathValue("name")
	rule, err := h.backend.GetRule(ctx, r.cred, name)
	if err != nil {
		code, msg := errorMessage(err, r.sess.principal, actRead)
		http.Error(w, msg, code)
		return
	}
	h.pages.render(w, http.StatusOK, "rule", "bound", h.ruleBound(ctx, r, name, rule.Cost.Durable))
}

// costForm is the cost form's fields as typed.
type costForm struct {
	Calendar, TimeZone, InlineMaxLimit, InlineMaxPeriod, ReservationTTL string
	Durable                                                             bool
}

// formOf is cost as the form shows it.
func formOf(c Cost) costForm {
	f := costForm{Calendar: c.Calendar, TimeZone: c.TimeZone, Durable: c.Durable}
	if c.InlineMaxLimit != 0 {
		f.InlineMaxLimit = strconv.FormatInt(c.InlineMaxLimit, 10)
	}
	if c.InlineMaxPeriod != 0 {
		f.InlineMaxPeriod = c.InlineMaxPeriod.String()
	}
	if c.ReservationTTL != 0 {
		f.ReservationTTL = c.ReservationTTL.String()
	}
	return f
}

// parseCost reads the form; empty fields are zero. The server validates
// the values themselves.
func parseCost(f costForm) (Cost, error) {
	c := Cost{Calendar: strings.TrimSpace(f.Calendar), TimeZone: strings.TrimSpace(f.TimeZone), Durable: f.Durable}
	switch c.Calendar {
	case "", "DAY", "WEEK", "MONTH":
	default:
		return c, status.Errorf(codes.InvalidArgument, "calendar %q is not DAY, WEEK or MONTH", c.Calendar)
	}
	var err error
	if v := strings.TrimSpace(f.InlineMaxLimit); v != "" {
		if c.InlineMaxLimit, err = strconv.ParseInt(v, 10, 64); err != nil {
			return c, status.Errorf(codes.InvalidArgument, "inline max limit %q is not a whole number", v)
		}
	}
	for _, d := range []struct {
		name string
		in   string
		out  *time.Duration
	}{{"inline max period", f.InlineMaxPeriod, &c.InlineMaxPeriod}, {"reservation TTL", f.ReservationTTL, &c.ReservationTTL}} {
		v := strings.TrimSpace(d.in)
		if v == "" {
			continue
		}
		if *d.out, err = time.ParseDuration(v); err != nil {
			return c, status.Errorf(codes.InvalidArgument, "%s %q is not a duration such as 1h or 30s", d.name, v)
		}
	}
	return c, nil
}

// canEdit says whether p may change rules (the Backend decides; this only
// chooses between a form and a read-only view).
func canEdit(p Principal) bool { return hasRole(p, "editor") || hasRole(p, "admin") }

// saveCost saves the cost form; on error the rule page comes back with
// the form as typed and the server's message verbatim.
func (h *handler) saveCost(w http.ResponseWriter, r *request) {
	name := r.PathValue("name")
	f := costForm{Calendar: r.PostFormValue("calendar"), TimeZone: r.PostFormValue("time_zone"),
		InlineMaxLimit: r.PostFormValue("inline_max_limit"), InlineMaxPeriod: r.PostFormValue("inline_max_period"),
		ReservationTTL: r.PostFormValue("reservation_ttl"), Durable: r.PostFormValue("durable") != ""}
	expected, _ := strconv.ParseUint(r.PostFormValue("expected_version"), 10, 64)
	ctx, cancel := h.call(r)
	defer cancel()
	cost, err := parseCost(f)
	var saved Rule
	if err == nil {
		saved, err = h.backend.(CostEditor).PutRuleCost(ctx, r.cred, name, cost, expected)
	}
	if err != nil {
		if status.Code(err) == codes.Unauthenticated {
			h.fail(w, r, err, actEdit)
			return
		}
		code, msg := errorMessage(err, r.sess.principal, actEdit)
		h.showRule(ctx, w, r, name, code, &f, msg)
		return
	}
	h.sessions.setFlash(r.sess, fmt.Sprintf("Saved the cost fields of %s: now version %d.", saved.Name, saved.Version))
	http.Redirect(w, r.Request, ruleURL(saved.Name), http.StatusSeeOther)
}
