package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	yaml3 "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/tokenserver/tokenserver/internal/rulepb"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func newRuleApplyCmd(a *app) *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or replace the rules of YAML files",
		Long: `Create or replace the rules of YAML (or JSON) files; -f - reads stdin.

A file holds one rule, a list of rules, an object {rules: [...]} (what
'rule list -o json' prints), or several of these as YAML documents separated
by '---'. Field names are the proto's JSON names (sampleCount; sample_count
works too), durations read like 1s or 250ms, and the algorithm is
TOKEN_BUCKET or token-bucket. Unknown fields are errors.

Every rule is read and validated before any is sent; then each is put in
order, and one line per rule shows its name and new version.`,
		Example: `  tokenctl rule apply -f rules.yaml
  cat rules.yaml | tokenctl rule apply -f -

  # rules.yaml
  name: api
  algorithm: TOKEN_BUCKET
  limit: 100
  period: 1s
  burst: 200
  ---
  - name: login
    algorithm: sliding-log
    limit: 5
    period: 1m
    penalty: 5m`,
		Args: argNames(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return usagef("-f/--filename is required")
			}
			var rules []*pb.Rule
			seen := map[string]string{} // rule name → where
			for _, f := range files {
				data, err := readSource(cmd, f)
				if err != nil {
					return err
				}
				rs, err := parseRules(data)
				if err != nil {
					return fmt.Errorf("%s: %w", sourceName(f), err)
				}
				for _, r := range rs {
					where := fmt.Sprintf("%s: document %d", sourceName(f), r.doc)
					if prev, dup := seen[r.rule.GetName()]; dup {
						return fmt.Errorf("%s: line %d: rule %q appears again (first in %s)", where, r.line, r.rule.GetName(), prev)
					}
					seen[r.rule.GetName()] = fmt.Sprintf("%s, line %d", where, r.line)
					rules = append(rules, r.rule)
				}
			}
			if len(rules) == 0 {
				names := make([]string, len(files))
				for i, f := range files {
					names[i] = sourceName(f)
				}
				return fmt.Errorf("no rules in %s", strings.Join(names, ", "))
			}
			_, admin, done, err := a.clients()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := a.context(cmd, 0)
			defer cancel()
			stored := make([]*pb.Rule, 0, len(rules))
			for _, r := range rules {
				var resp *pb.PutRuleResponse
				err := a.call(ctx, fmt.Sprintf("put rule %q", r.GetName()), func(ctx context.Context) (err error) {
					resp, err = admin.PutRule(ctx, &pb.PutRuleRequest{Rule: r})
					return err
				})
				if err != nil {
					if len(stored) > 0 {
						a.logf("applied %d of %d rules before the error", len(stored), len(rules))
						if !a.json() {
							_ = writeApplied(a.stdout, stored)
						}
					}
					return err
				}
				stored = append(stored, resp.GetRule())
			}
			if a.json() {
				return writeRulesJSON(a.stdout, stored)
			}
			return writeApplied(a.stdout, stored)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "YAML file of rules, - for stdin (repeatable)")
	return cmd
}

// writeApplied prints one line per applied rule: its name and version.
func writeApplied(w io.Writer, rules []*pb.Rule) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION")
	for _, r := range rules {
		fmt.Fprintf(tw, "%s\t%d\n", r.GetName(), r.GetVersion())
	}
	return tw.Flush()
}

func sourceName(f string) string {
	if f == "-" {
		return "<stdin>"
	}
	return f
}

// readSource reads a file, or stdin for "-".
func readSource(cmd *cobra.Command, f string) ([]byte, error) {
	if f == "-" {
		b, err := io.ReadAll(cmd.InOrStdin())
		if err != nil {
			return nil, fmt.Errorf("read stdin: %w", err)
		}
		return b, nil
	}
	b, err := os.ReadFile(f)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// parsedRule is one rule read from a file, with where it was found.
type parsedRule struct {
	rule *pb.Rule
	doc  int // 1-based YAML document
	line int // the line the rule starts on
}

// yamlDoc is one YAML document of a file. Its text is preceded by as many
// blank lines as the file has before it, so that parsers report the file's
// line numbers.
type yamlDoc struct {
	index       int
	first, last int // lines of the file, 1-based
	text        []byte
}

// splitDocuments splits a YAML stream at its "---" and "..." lines.
func splitDocuments(data []byte) []yamlDoc {
	var docs []yamlDoc
	lines := strings.SplitAfter(string(data), "\n")
	start := 0 // index of the current document's first line
	flush := func(end int) {
		var b strings.Builder
		b.WriteString(strings.Repeat("\n", start))
		for _, l := range lines[start:end] {
			b.WriteString(l)
		}
		docs = append(docs, yamlDoc{index: len(docs) + 1, first: start + 1, last: end, text: []byte(b.String())})
	}
	for i, l := range lines {
		t := strings.TrimRight(l, " \t\r\n")
		switch {
		case t == "---" || t == "...":
			flush(i)
			lines[i] = "\n"
			start = i + 1
		case strings.HasPrefix(t, "--- "):
			// A document that starts on the marker's line: keep its columns.
			flush(i)
			lines[i] = "   " + l[3:]
			start = i
		}
	}
	flush(len(lines))
	// Renumber, counting only documents that hold something, so that
	// "document 1" is the first one a person sees.
	out := docs[:0]
	for _, d := range docs {
		if len(bytes.TrimSpace(stripComments(d.text))) == 0 {
			continue
		}
		d.index = len(out) + 1
		out = append(out, d)
	}
	return out
}

// stripComments drops whole-line comments (enough to tell an empty document).
func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(out, t...)
			out = append(out, '\n')
		}
	}
	return out
}

var (
	lineRe         = regexp.MustCompile(`line (\d+)(?::\d+)?:?\s*`)
	unknownFieldRe = regexp.MustCompile(`unknown field "([^"]+)"`)
	fieldRe        = regexp.MustCompile(`field ([A-Za-z_][A-Za-z0-9_.]*)`)
)

// parseRules reads every rule of a YAML stream and validates it as the
// server would, so that a bad rule is found before any is sent. Errors name
// the document and the line.
func parseRules(data []byte) ([]parsedRule, error) {
	var out []parsedRule
	for _, d := range splitDocuments(data) {
		rs, err := d.rules()
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

// rules reads the rules of one document.
func (d *yamlDoc) rules() ([]parsedRule, error) {
	js, err := yaml.YAMLToJSONStrict(d.text)
	if err != nil {
		line, msg := yamlErrorLine(cleanYAMLError(err.Error()))
		return nil, d.errorf(line, "%s", msg)
	}
	items, err := d.items(js)
	if err != nil {
		return nil, err
	}
	var out []parsedRule
	for i, raw := range items {
		r := new(pb.Rule)
		if err := (protojson.UnmarshalOptions{}).Unmarshal(friendlyJSON(raw), r); err != nil {
			msg := cleanProtoJSONError(err.Error())
			return nil, d.errorf(d.line(i, fieldOf(msg), valueOf(msg)), "%s%s", d.ruleLabel(i, raw), msg)
		}
		if err := validate(r); err != nil {
			msg := err.Error()
			return nil, d.errorf(d.line(i, validationField(msg), ""), "%s", msg)
		}
		out = append(out, parsedRule{rule: r, doc: d.index, line: d.line(i, "", "")})
	}
	return out, nil
}

// items returns the rule objects of a document: the document itself, its
// elements when it is a list, or the elements of its "rules".
func (d *yamlDoc) items(js []byte) ([]json.RawMessage, error) {
	js = bytes.TrimSpace(js)
	if len(js) == 0 || bytes.Equal(js, []byte("null")) {
		return nil, nil
	}
	switch js[0] {
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(js, &items); err != nil {
			return nil, d.errorf(0, "%v", err)
		}
		return items, nil
	case '{':
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(js, &obj); err != nil {
			return nil, d.errorf(0, "%v", err)
		}
		list, ok := obj["rules"]
		if !ok {
			return []json.RawMessage{js}, nil
		}
		for k := range obj {
			if k != "rules" {
				return nil, d.errorf(d.keyLine(k), "unknown field %q beside \"rules\"", k)
			}
		}
		var items []json.RawMessage
		if err := json.Unmarshal(list, &items); err != nil {
			return nil, d.errorf(d.keyLine("rules"), "\"rules\" must be a list of rules")
		}
		return items, nil
	}
	return nil, d.errorf(0, "want a rule, a list of rules or {rules: [...]}, got %s", js)
}

// validate checks a rule as the server will, with the server's messages.
func validate(p *pb.Rule) error {
	r := rulepb.FromProto(p)
	r.Normalize()
	if err := r.Validate(); err != nil {
		return err
	}
	return nil
}

// ruleLabel names item i for an error: its name when it has one.
func (d *yamlDoc) ruleLabel(i int, raw json.RawMessage) string {
	var named struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &named) == nil && named.Name != "" {
		return fmt.Sprintf("rule %q: ", named.Name)
	}
	return fmt.Sprintf("rule %d: ", i+1)
}

// yamlErrorLine takes the line out of a YAML parser's message ("line 3:
// mapping values are not allowed"); 0 when it names none.
func yamlErrorLine(msg string) (int, string) {
	m := lineRe.FindStringSubmatchIndex(msg)
	if m == nil {
		return 0, msg
	}
	n, err := strconv.Atoi(msg[m[2]:m[3]])
	if err != nil {
		return 0, msg
	}
	return n, msg[:m[0]] + msg[m[1]:]
}

// errorf formats an error of the document at a line (0: unknown).
func (d *yamlDoc) errorf(line int, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if line > 0 {
		return fmt.Errorf("document %d: line %d: %s", d.index, line, msg)
	}
	return fmt.Errorf("document %d (lines %d-%d): %s", d.index, d.first, d.last, msg)
}

// cleanYAMLError drops the wrapping of sigs.k8s.io/yaml's errors.
func cleanYAMLError(s string) string {
	s = strings.TrimPrefix(s, "error converting YAML to JSON: ")
	s = strings.TrimPrefix(s, "yaml: ")
	s = strings.ReplaceAll(s, ":\n  ", ": ")
	return strings.ReplaceAll(s, "\n  ", "; ")
}

// cleanProtoJSONError drops protojson's prefix and its position in the JSON,
// which means nothing to a person who wrote YAML.
// (protobuf-go puts a space or a no-break space after "proto:" at random.)
var protoPosRe = regexp.MustCompile(`^proto:[\s\x{00a0}]*(\(line \d+:\d+\):[\s\x{00a0}]*)?`)

func cleanProtoJSONError(s string) string {
	return protoPosRe.ReplaceAllString(s, "")
}

// valueOf is the quoted value at the end of an error message, or "".
var valueRe = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"$`)

func valueOf(msg string) string {
	if m := valueRe.FindStringSubmatch(msg); m != nil {
		if v, err := strconv.Unquote(`"` + m[1] + `"`); err == nil {
			return v
		}
	}
	return ""
}

// fieldOf is the field an error message names, or "".
func fieldOf(msg string) string {
	if m := unknownFieldRe.FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	if m := fieldRe.FindStringSubmatch(msg); m != nil {
		parts := strings.Split(m[1], ".")
		return parts[len(parts)-1]
	}
	return ""
}

// validationField is the field a rule validation message is about: the
// first word after `rule "NAME": ` ("limit", "lease.ttl", "overrides[2]").
func validationField(msg string) string {
	_, rest, ok := strings.Cut(msg, "\": ")
	if !ok {
		return ""
	}
	end := strings.IndexAny(rest, " :[")
	if end < 0 {
		return ""
	}
	parts := strings.Split(rest[:end], ".")
	return parts[len(parts)-1]
}

// node parses the document for positions (only on the error path).
func (d *yamlDoc) node() *yaml3.Node {
	var n yaml3.Node
	if err := yaml3.Unmarshal(d.text, &n); err != nil || n.Kind != yaml3.DocumentNode || len(n.Content) == 0 {
		return nil
	}
	return n.Content[0]
}

// itemNode is the node of rule i of the document.
func (d *yamlDoc) itemNode(i int) *yaml3.Node {
	root := d.node()
	if root == nil {
		return nil
	}
	if root.Kind == yaml3.MappingNode {
		if v := mapValue(root, "rules"); v != nil {
			root = v
		} else if i == 0 {
			return root
		}
	}
	if root.Kind == yaml3.SequenceNode && i < len(root.Content) {
		return root.Content[i]
	}
	return nil
}

// line is the line of field, or else of a scalar whose value is value (any
// depth; "" for neither) in rule i: the rule's own line when neither is
// found, 0 when the rule is not found.
func (d *yamlDoc) line(i int, field, value string) int {
	n := d.itemNode(i)
	if n == nil {
		return 0
	}
	if field != "" {
		if k := findKey(n, field); k != nil {
			return k.Line
		}
	}
	if value != "" {
		if v := findValue(n, value); v != nil {
			return v.Line
		}
	}
	return n.Line
}

// findValue finds a scalar with value v under n, depth first.
func findValue(n *yaml3.Node, v string) *yaml3.Node {
	if n.Kind == yaml3.ScalarNode && n.Value == v {
		return n
	}
	for _, c := range n.Content {
		if f := findValue(c, v); f != nil {
			return f
		}
	}
	return nil
}

// keyLine is the line of a top-level key of the document.
func (d *yamlDoc) keyLine(key string) int {
	root := d.node()
	if root == nil || root.Kind != yaml3.MappingNode {
		return 0
	}
	for j := 0; j+1 < len(root.Content); j += 2 {
		if root.Content[j].Value == key {
			return root.Content[j].Line
		}
	}
	return 0
}

func mapValue(m *yaml3.Node, key string) *yaml3.Node {
	for j := 0; j+1 < len(m.Content); j += 2 {
		if m.Content[j].Value == key {
			return m.Content[j+1]
		}
	}
	return nil
}

// findKey finds a mapping key named field (in its JSON or proto spelling)
// anywhere under n, depth first.
func findKey(n *yaml3.Node, field string) *yaml3.Node {
	if n.Kind == yaml3.MappingNode {
		for j := 0; j+1 < len(n.Content); j += 2 {
			if sameField(n.Content[j].Value, field) {
				return n.Content[j]
			}
		}
	}
	for _, c := range n.Content {
		if k := findKey(c, field); k != nil {
			return k
		}
	}
	return nil
}

// sameField compares field names ignoring the difference between
// lowerCamelCase and snake_case.
func sameField(a, b string) bool {
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }
	return norm(a) == norm(b)
}

// friendlyJSON rewrites what people write in YAML into what protojson
// reads, leaving everything else as it is: enum values spelled as tokenctl's
// flags spell them (algorithm: token-bucket, fallback.policy: local), and
// durations in Go's syntax (1m, 1h30m, 250ms) where protojson reads only
// seconds ("60s").
func friendlyJSON(raw json.RawMessage) json.RawMessage {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return raw
	}
	changed := false
	rewrite := func(m map[string]json.RawMessage, key string, f func(string) (string, bool)) {
		var s string
		if v, ok := m[key]; ok && json.Unmarshal(v, &s) == nil {
			if t, ok := f(s); ok && t != s {
				m[key], _ = json.Marshal(t)
				changed = true
			}
		}
	}
	enumAlg := func(s string) (string, bool) {
		a, err := parseAlgorithm(s)
		return a.String(), err == nil
	}
	enumFallback := func(s string) (string, bool) {
		p, err := parseFallback(s)
		return p.String(), err == nil
	}
	rewrite(obj, "algorithm", enumAlg)
	for _, k := range []string{"period", "warmup", "penalty"} {
		rewrite(obj, k, protoDuration)
	}
	for _, sub := range []struct {
		key  string
		keys []string
		f    func(string) (string, bool)
	}{{"fallback", []string{"policy"}, enumFallback}, {"lease", []string{"ttl"}, protoDuration}} {
		var m map[string]json.RawMessage
		if v, ok := obj[sub.key]; !ok || json.Unmarshal(v, &m) != nil {
			continue
		}
		before := changed
		changed = false
		for _, k := range sub.keys {
			rewrite(m, k, sub.f)
		}
		if changed {
			obj[sub.key], _ = json.Marshal(m)
		}
		changed = changed || before
	}
	if !changed {
		return raw
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return raw
	}
	return b
}

// protoDuration turns a Go duration ("1m30s") into protojson's form ("90s").
func protoDuration(s string) (string, bool) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return "", false
	}
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	secs, nanos := int64(d/time.Second), int64(d%time.Second)
	if nanos == 0 {
		return fmt.Sprintf("%s%ds", sign, secs), true
	}
	return sign + strings.TrimRight(fmt.Sprintf("%d.%09d", secs, nanos), "0") + "s", true
}
