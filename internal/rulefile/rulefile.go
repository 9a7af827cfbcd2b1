// Package rulefile reads rule files, YAML documents of tokenserver.v1.Rule
// in the proto's JSON field names, into validated rules, and reports each
// problem at its file, line and column.
//
// Decoding is yaml.v3's: a Decoder over the stream (multi-document) with
// KnownFields, into typed structs whose leaf types read durations and enums.
// Two things are our own, because yaml.v3 reports them only as text: a walk
// over the document's Node tree that finds unknown, duplicate and mistyped
// fields first, at their positions (checkFields), and the mapping of
// rule.FieldError's path back to a Node (nodeAt).
package rulefile

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// Pos is a place in a file. Line and Column are 1-based; 0 when unknown.
type Pos struct {
	File         string
	Line, Column int
}

// String returns "file:line:col", "file:line" or "file".
func (p Pos) String() string {
	switch {
	case p.Line == 0:
		return p.File
	case p.Column == 0:
		return fmt.Sprintf("%s:%d", p.File, p.Line)
	}
	return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Column)
}

// Error is a problem at a place in a file. Err is a *rule.FieldError when
// the rule decoded but did not validate (find it with errors.As).
type Error struct {
	Pos Pos
	Err error
}

func (e *Error) Error() string { return e.Pos.String() + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// Rule is one rule of a file.
type Rule struct {
	// Rule is the rule as written: valid, not normalized.
	Rule *rule.Rule
	// Pos is where the rule starts.
	Pos Pos
	// Durable is the rule's `durable` field (tokenserver.v1.Rule.durable),
	// kept beside Rule because rule.Rule does not carry it: a writer sets
	// it on the proto it sends.
	Durable bool
}

// Parse reads every rule of a YAML stream named name (for errors): each
// document is one rule, a list of rules, or {rules: [...]} (what 'tokenctl
// rule list -o json' prints); empty documents hold none. Every rule is
// validated as the server validates it; the first problem is returned as an
// *Error.
func Parse(name string, data []byte) ([]Rule, error) {
	// Pass 1: the Node tree of each document, for shapes and positions.
	var docs []*yaml.Node
	nodes := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := nodes.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// yaml.v3's syntax errors carry their line in the text only.
			return nil, &Error{Pos: Pos{File: name}, Err: err}
		}
		docs = append(docs, &doc)
	}
	// Pass 2: the typed decoding, document by document, in step.
	typed := yaml.NewDecoder(bytes.NewReader(data))
	typed.KnownFields(true)
	var out []Rule
	for _, doc := range docs {
		rs, err := parseDocument(name, doc, typed)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

// parseDocument reads the rules of one document; dec is at the document.
func parseDocument(file string, doc *yaml.Node, dec *yaml.Decoder) ([]Rule, error) {
	at := func(n *yaml.Node, err error) error {
		return &Error{Pos: Pos{File: file, Line: n.Line, Column: n.Column}, Err: err}
	}
	var root *yaml.Node
	if len(doc.Content) > 0 {
		root = deref(doc.Content[0])
	}
	var items []*yaml.Node // the rules' nodes
	var target any         // what dec decodes the document into
	var docs []ruleDoc
	switch {
	case root == nil || root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null":
		var skip yaml.Node
		if err := dec.Decode(&skip); err != nil {
			return nil, at(doc, err)
		}
		return nil, nil
	case root.Kind == yaml.MappingNode && lookup(root, "rules") != nil:
		for i := 0; i+1 < len(root.Content); i += 2 {
			if k := root.Content[i]; k.Value != "rules" {
				return nil, at(k, fmt.Errorf("unknown field %q beside \"rules\"", k.Value))
			}
		}
		list := deref(lookup(root, "rules"))
		if list.Kind != yaml.SequenceNode && list.ShortTag() != "!!null" {
			return nil, at(list, errors.New(`"rules" must be a list of rules`))
		}
		items = list.Content
		target = new(listDoc)
	case root.Kind == yaml.MappingNode:
		items = []*yaml.Node{root}
		docs = make([]ruleDoc, 1)
		target = &docs[0]
	case root.Kind == yaml.SequenceNode:
		items = root.Content
		target = &docs
	default:
		return nil, at(root, fmt.Errorf("want a rule, a list of rules or {rules: [...]}, got %s", kindName(root)))
	}
	for _, item := range items {
		if deref(item).Kind != yaml.MappingNode {
			return nil, at(item, fmt.Errorf("want a rule (a mapping), got %s", kindName(deref(item))))
		}
		if err := checkFields(item, ruleType); err != nil {
			return nil, labeled(file, item, err)
		}
	}
	if err := decodeInto(dec, target, &docs); err != nil {
		var pe *posError
		if errors.As(err, &pe) {
			return nil, labeled(file, enclosing(items, pe), err)
		}
		return nil, at(doc, err)
	}
	out := make([]Rule, 0, len(items))
	for i, item := range items {
		r := docs[i].rule()
		if err := validate(r); err != nil {
			n := item
			var fe *rule.FieldError
			if errors.As(err, &fe) {
				n = nodeAt(item, fe.Path)
			}
			return nil, at(n, err)
		}
		out = append(out, Rule{Rule: r, Pos: Pos{File: file, Line: item.Line, Column: item.Column}, Durable: bool(docs[i].Durable)})
	}
	return out, nil
}

// decodeInto decodes the next document into target; a *listDoc's rules end
// up in docs.
func decodeInto(dec *yaml.Decoder, target any, docs *[]ruleDoc) error {
	if err := dec.Decode(target); err != nil {
		return err
	}
	if l, ok := target.(*listDoc); ok {
		*docs = l.Rules
	}
	return nil
}

// validate checks a rule as the server does: normalized. When that fails,
// the error returned is the rule's first problem as written, so that its
// path's indices are the file's (normalizing sorts overrides and drops
// duplicate deny and allow entries, so a rule invalid normalized is invalid
// as written too).
func validate(r *rule.Rule) error {
	n := r.Clone()
	n.Normalize()
	err := n.Validate()
	if err == nil {
		return nil
	}
	if asWritten := r.Validate(); asWritten != nil {
		return asWritten
	}
	return err
}

// labeled is err (a *posError, or an error at item) as an *Error that names
// the rule item when it has a name.
func labeled(file string, item *yaml.Node, err error) error {
	pos := Pos{File: file}
	var pe *posError
	if errors.As(err, &pe) {
		pos.Line, pos.Column = pe.line, pe.col
	} else if item != nil {
		pos.Line, pos.Column = item.Line, item.Column
	}
	if item != nil {
		if name := lookup(deref(item), "name"); name != nil && name.ShortTag() == "!!str" && name.Value != "" {
			err = fmt.Errorf("rule %q: %w", name.Value, err)
		}
	}
	return &Error{Pos: pos, Err: err}
}

// enclosing is the item the position of pe falls in: the last that starts
// at or before it (nil: none).
func enclosing(items []*yaml.Node, pe *posError) *yaml.Node {
	var in *yaml.Node
	for _, it := range items {
		if it.Line < pe.line || it.Line == pe.line && it.Column <= pe.col {
			in = it
		}
	}
	return in
}
