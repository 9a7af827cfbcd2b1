package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// One JSON style for everything tokenctl prints with -o json or -o yaml:
//   - API objects (rules, cluster and node status, refill and lease
//     answers, snapshot restore...) are protojson: the proto's JSON
//     (lowerCamelCase) names, 64-bit integers as JSON strings, durations
//     like "1.500s", every field present (zero values too) for scripts;
//   - rules alone leave their zero-valued fields out, as rule files are
//     written, so that `rule get` and `rule list` output applies again
//     with `rule apply -f` (and a rule file holds only what was set);
//   - tokenctl's own result objects (acquire's tally, refill, bench,
//     token create...) use the same lowerCamelCase names, every field
//     present, numbers as numbers.
//
// -o yaml is the same document as YAML (keys in the same order), which
// internal/rulefile reads back for rules.
var (
	jsonOpts = protojson.MarshalOptions{EmitUnpopulated: true}
	ruleOpts = protojson.MarshalOptions{}
)

// protoJSON marshals m (jsonOpts; ruleOpts for a rule), compact and with
// stable spacing (protojson's own output varies its whitespace on
// purpose).
func protoJSON(m proto.Message) (json.RawMessage, error) {
	opts := jsonOpts
	if _, ok := m.(*pb.Rule); ok {
		opts = ruleOpts
	}
	b, err := opts.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s as JSON: %w", m.ProtoReflect().Descriptor().Name(), err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// toJSON encodes v: a proto.Message as protoJSON, anything else (a result
// struct with lowerCamelCase tags, a json.RawMessage) with encoding/json.
func toJSON(v any) ([]byte, error) {
	if m, ok := v.(proto.Message); ok {
		return protoJSON(m)
	}
	return json.Marshal(v)
}

// structured reports whether -o json or -o yaml was asked for.
func (a *app) structured() bool { return a.output == "json" || a.output == "yaml" }

// write prints v (see toJSON) as indented JSON or as YAML, per -o.
func (a *app) write(v any) error {
	b, err := toJSON(v)
	if err != nil {
		return err
	}
	if a.output == "yaml" {
		return writeYAML(a.stdout, b)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err = a.stdout.Write(buf.Bytes())
	return err
}

// writeLine prints v as one compact JSON line, or as one YAML document
// that starts with "---", for commands that print a stream of results.
func (a *app) writeLine(v any) error {
	b, err := toJSON(v)
	if err != nil {
		return err
	}
	if a.output == "yaml" {
		if _, err := io.WriteString(a.stdout, "---\n"); err != nil {
			return err
		}
		return writeYAML(a.stdout, b)
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

// writeYAML writes the JSON document b as block-style YAML, keys in their
// order. JSON is YAML, so yaml.v3 reads it into a Node tree; clearing the
// flow and quoting styles lets the encoder choose block style, and it
// still quotes the strings that would read as another type ("12").
func writeYAML(w io.Writer, b []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("convert JSON to YAML: %w", err)
	}
	var plain func(n *yaml.Node)
	plain = func(n *yaml.Node) {
		n.Style = 0
		for _, c := range n.Content {
			plain(c)
		}
	}
	plain(&doc)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return fmt.Errorf("write YAML: %w", err)
	}
	return enc.Close()
}

// ruleList is what `rule list` and `rule apply` print: {"rules": [...]},
// a form `rule apply` reads back.
type ruleList struct {
	Rules []json.RawMessage `json:"rules"`
}

// newRuleList encodes rules; a missing list is written as [].
func newRuleList(rules []*pb.Rule) (ruleList, error) {
	out := ruleList{Rules: make([]json.RawMessage, 0, len(rules))}
	for _, r := range rules {
		b, err := protoJSON(r)
		if err != nil {
			return out, err
		}
		out.Rules = append(out.Rules, b)
	}
	return out, nil
}

// writeRules prints rules as a ruleList.
func (a *app) writeRules(rules []*pb.Rule) error {
	l, err := newRuleList(rules)
	if err != nil {
		return err
	}
	return a.write(l)
}

// algorithmNames spells the algorithms as flags do.
var algorithmNames = map[pb.Algorithm]string{
	pb.Algorithm_TOKEN_BUCKET:   "token-bucket",
	pb.Algorithm_LEAKY_BUCKET:   "leaky-bucket",
	pb.Algorithm_FIXED_WINDOW:   "fixed-window",
	pb.Algorithm_SLIDING_WINDOW: "sliding-window",
	pb.Algorithm_SLIDING_LOG:    "sliding-log",
	pb.Algorithm_CONCURRENCY:    "concurrency",
}

// algorithmName is the flag spelling of a, or the enum's name.
func algorithmName(a pb.Algorithm) string {
	if n, ok := algorithmNames[a]; ok {
		return n
	}
	return a.String()
}

// parseAlgorithm reads token-bucket (or TOKEN_BUCKET, token_bucket).
func parseAlgorithm(s string) (pb.Algorithm, error) {
	norm := strings.ReplaceAll(strings.ToLower(s), "_", "-")
	for a, n := range algorithmNames {
		if n == norm {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want token-bucket, leaky-bucket, fixed-window, sliding-window, sliding-log or concurrency)", s)
}

// fallbackNames spells the fallback policies as flags do.
var fallbackNames = map[pb.FallbackPolicy]string{
	pb.FallbackPolicy_ALLOW: "allow",
	pb.FallbackPolicy_DENY:  "deny",
	pb.FallbackPolicy_LOCAL: "local",
}

func parseFallback(s string) (pb.FallbackPolicy, error) {
	norm := strings.ToLower(s)
	for p, n := range fallbackNames {
		if n == norm {
			return p, nil
		}
	}
	return 0, fmt.Errorf("unknown fallback policy %q (want local, allow or deny)", s)
}

// capacity is the most permits one request can take under the rule's
// default limit: burst for the buckets when set, else the limit.
func capacity(r *pb.Rule) int64 {
	switch r.GetAlgorithm() {
	case pb.Algorithm_TOKEN_BUCKET, pb.Algorithm_LEAKY_BUCKET:
		if r.GetBurst() > 0 {
			return r.GetBurst()
		}
	}
	return r.GetLimit()
}

// fmtDur prints a Duration, "-" when unset.
func fmtDur(d *durationpb.Duration) string {
	if d == nil {
		return "-"
	}
	return d.AsDuration().String()
}

// writeRuleTable writes one rule as "field: value" lines.
func writeRuleTable(w io.Writer, r *pb.Rule) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, args ...any) {
		fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{k}, args...)...)
	}
	row("name", "%s", r.GetName())
	row("algorithm", "%s", algorithmName(r.GetAlgorithm()))
	row("limit", "%d", r.GetLimit())
	row("period", "%s", fmtDur(r.GetPeriod()))
	switch a := r.GetAlgorithm(); {
	case a == pb.Algorithm_TOKEN_BUCKET || a == pb.Algorithm_LEAKY_BUCKET:
		if r.GetBurst() == 0 {
			row("burst", "%d (the limit)", r.GetLimit())
		} else {
			row("burst", "%d", r.GetBurst())
		}
	case r.GetBurst() != 0:
		row("burst", "%d (not used by %s)", r.GetBurst(), algorithmName(a))
	}
	if r.GetAlgorithm() == pb.Algorithm_SLIDING_WINDOW || r.GetSampleCount() != 0 {
		if r.GetSampleCount() == 0 {
			row("sample count", "default")
		} else {
			row("sample count", "%d", r.GetSampleCount())
		}
	}
	if r.GetWarmup().AsDuration() != 0 {
		row("warmup", "%s", fmtDur(r.GetWarmup()))
	}
	if r.GetPenalty().AsDuration() != 0 {
		row("penalty", "%s", fmtDur(r.GetPenalty()))
	}
	if r.GetMaxKeys() != 0 {
		row("max keys", "%d", r.GetMaxKeys())
	}
	if len(r.GetOverrides()) > 0 {
		row("overrides", "%s", overridesString(r.GetOverrides()))
	}
	if len(r.GetDeny()) > 0 {
		row("deny", "%s", strings.Join(r.GetDeny(), ", "))
	}
	if len(r.GetAllow()) > 0 {
		row("allow", "%s", strings.Join(r.GetAllow(), ", "))
	}
	if r.GetShadow() {
		row("shadow", "true")
	}
	if f := r.GetFallback(); f != nil {
		row("fallback", "%s", fallbackString(f))
	}
	if l := r.GetLease(); l != nil {
		row("lease", "max %d, ttl %s", l.GetMaxBatch(), fmtDur(l.GetTtl()))
	}
	if c := r.GetCalendar(); c != pb.Calendar_CALENDAR_UNSPECIFIED {
		tz := r.GetTimeZone()
		if tz == "" {
			tz = "UTC"
		}
		row("calendar", "%s in %s", calendarNames[c], tz)
	}
	if in := r.GetInline(); in.GetMaxLimit() != 0 {
		if in.GetMaxPeriod().AsDuration() != 0 {
			row("inline", "max limit %d, max period %s", in.GetMaxLimit(), fmtDur(in.GetMaxPeriod()))
		} else {
			row("inline", "max limit %d", in.GetMaxLimit())
		}
	}
	if t := r.GetReservationTtl(); t.AsDuration() != 0 {
		row("reservation ttl", "%s", fmtDur(t))
	}
	if r.GetDurable() {
		row("durable", "true")
	}
	row("version", "%d", r.GetVersion())
	row("generation", "%d", r.GetGeneration())
	if r.GetUpdatedBy() != "" {
		row("updated by", "%s", r.GetUpdatedBy())
	}
	return tw.Flush()
}

func overridesString(os []*pb.Override) string {
	parts := make([]string, len(os))
	for i, o := range os {
		parts[i] = fmt.Sprintf("%s=%d", o.GetKey(), o.GetLimit())
		if o.GetBurst() != 0 {
			parts[i] += fmt.Sprintf("/%d", o.GetBurst())
		}
	}
	return strings.Join(parts, ", ")
}

func fallbackString(f *pb.Fallback) string {
	n, ok := fallbackNames[f.GetPolicy()]
	if !ok {
		n = "unspecified"
	}
	if f.GetLimit() != 0 {
		n += fmt.Sprintf(" (limit %d)", f.GetLimit())
	}
	return n
}

// writeRulesTable writes rules as a table, one row each.
func writeRulesTable(w io.Writer, rules []*pb.Rule) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tALGORITHM\tLIMIT\tPERIOD\tBURST\tVERSION\tOPTIONS")
	for _, r := range rules {
		var opts []string
		if n := len(r.GetOverrides()); n > 0 {
			opts = append(opts, fmt.Sprintf("overrides=%d", n))
		}
		if n := len(r.GetDeny()); n > 0 {
			opts = append(opts, fmt.Sprintf("deny=%d", n))
		}
		if n := len(r.GetAllow()); n > 0 {
			opts = append(opts, fmt.Sprintf("allow=%d", n))
		}
		if r.GetSampleCount() != 0 {
			opts = append(opts, fmt.Sprintf("samples=%d", r.GetSampleCount()))
		}
		if r.GetWarmup().AsDuration() != 0 {
			opts = append(opts, "warmup="+fmtDur(r.GetWarmup()))
		}
		if r.GetPenalty().AsDuration() != 0 {
			opts = append(opts, "penalty="+fmtDur(r.GetPenalty()))
		}
		if r.GetMaxKeys() != 0 {
			opts = append(opts, fmt.Sprintf("max-keys=%d", r.GetMaxKeys()))
		}
		if r.GetShadow() {
			opts = append(opts, "shadow")
		}
		if f := r.GetFallback(); f != nil {
			fb := "fallback=" + fallbackNames[f.GetPolicy()]
			if f.GetLimit() != 0 {
				fb += fmt.Sprintf("/%d", f.GetLimit())
			}
			opts = append(opts, fb)
		}
		if l := r.GetLease(); l != nil {
			opts = append(opts, fmt.Sprintf("lease=%d/%s", l.GetMaxBatch(), fmtDur(l.GetTtl())))
		}
		o := strings.Join(opts, " ")
		if o == "" {
			o = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\t%s\n", r.GetName(), algorithmName(r.GetAlgorithm()), r.GetLimit(),
			fmtDur(r.GetPeriod()), capacity(r), r.GetVersion(), o)
	}
	return tw.Flush()
}

// fmtNs prints nanoseconds as a duration.
func fmtNs(ns int64) string { return time.Duration(ns).String() }
