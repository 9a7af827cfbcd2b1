package rulefile

import (
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

var ruleType = reflect.TypeFor[ruleDoc]()

// canonical folds a field name's JSON and proto spellings together:
// sampleCount and sample_count are both "samplecount".
func canonical(name string) string {
	return strings.ToLower(strings.ReplaceAll(name, "_", ""))
}

// checkFields walks n as a value of type t and reports, at its position,
// the first key t has no field for, a field given twice (in either
// spelling), or a mapping or list where t wants something else. Scalars are
// left to the leaf types. yaml.v3's KnownFields would find the unknown
// fields too, but says where only in its message's text.
func checkFields(n *yaml.Node, t reflect.Type) error {
	c := &checker{budget: maxVisits}
	return c.fields(n, t)
}

// maxVisits bounds the nodes one rule's check visits: aliases can make a
// small document a huge tree ("billion laughs"), which yaml.v3 refuses
// only when it decodes.
const maxVisits = 1 << 18

// checker is the state of one checkFields walk.
type checker struct{ budget int }

func (c *checker) fields(n *yaml.Node, t reflect.Type) error {
	if c.budget--; c.budget < 0 {
		return errorAt(n, "too many nodes through aliases (more than %d)", maxVisits)
	}
	n = deref(n)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return errorAt(n, "want a mapping of %s, got %s", fieldList(t), kindName(n))
		}
		return c.mapping(n, t, map[string]string{})
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return errorAt(n, "want a list, got %s", kindName(n))
		}
		for _, e := range n.Content {
			if err := c.fields(e, t.Elem()); err != nil {
				return err
			}
		}
	}
	return nil
}

// mapping checks the keys of mapping n against struct t, then those
// of the mappings it merges with <<, which its own keys override; seen holds
// the canonical names already set.
func (c *checker) mapping(n *yaml.Node, t reflect.Type, seen map[string]string) error {
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		f, ok := field(t, k.Value)
		if !ok {
			return errorAt(k, "unknown field %q (want %s)", k.Value, fieldList(t))
		}
		name := canonical(k.Value)
		if prev, dup := seen[name]; dup {
			if prev == k.Value {
				return errorAt(k, "field %q appears twice", k.Value)
			}
			return errorAt(k, "field %q is set twice (also as %q)", k.Value, prev)
		}
		seen[name] = k.Value
		if err := c.fields(v, f.Type); err != nil {
			return err
		}
	}
	for _, v := range merges {
		if err := c.merge(v, t, seen); err != nil {
			return err
		}
	}
	return nil
}

// merge checks what a << key merges, a mapping or a list of them:
// their keys that are not set yet.
func (c *checker) merge(v *yaml.Node, t reflect.Type, seen map[string]string) error {
	if c.budget--; c.budget < 0 {
		return errorAt(v, "too many nodes through aliases (more than %d)", maxVisits)
	}
	v = deref(v)
	switch v.Kind {
	case yaml.MappingNode:
		// Keys set already override the merged ones: check the rest.
		rest := &yaml.Node{Kind: yaml.MappingNode}
		for i := 0; i+1 < len(v.Content); i += 2 {
			if _, set := seen[canonical(v.Content[i].Value)]; !set || v.Content[i].ShortTag() == "!!merge" {
				rest.Content = append(rest.Content, v.Content[i], v.Content[i+1])
			}
		}
		return c.mapping(rest, t, seen)
	case yaml.SequenceNode:
		for _, m := range v.Content {
			if err := c.merge(m, t, seen); err != nil {
				return err
			}
		}
		return nil
	}
	return errorAt(v, "<< merges a mapping or a list of mappings, not %s", kindName(v))
}

// field is the field of struct t whose yaml name is name.
func field(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		if f := t.Field(i); f.Tag.Get("yaml") == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// fieldList names t's fields in their JSON spelling, for messages.
func fieldList(t reflect.Type) string {
	var names []string
	seen := map[string]bool{}
	for i := range t.NumField() {
		name := t.Field(i).Tag.Get("yaml")
		if c := canonical(name); !seen[c] {
			seen[c] = true
			names = append(names, name)
		}
	}
	return strings.Join(names, ", ")
}

// deref follows an alias to the node it names.
func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// lookup is the value of key in mapping m (either spelling; in m or what it
// merges), or nil.
func lookup(m *yaml.Node, key string) *yaml.Node {
	_, v := lookupKey(m, key)
	return v
}

// lookupKey is lookup that returns the key's node too.
func lookupKey(m *yaml.Node, key string) (k, v *yaml.Node) {
	m = deref(m)
	if m == nil || m.Kind != yaml.MappingNode {
		return nil, nil
	}
	var merged []*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		switch {
		case k.ShortTag() == "!!merge":
			merged = append(merged, m.Content[i+1])
		case canonical(k.Value) == canonical(key):
			return k, m.Content[i+1]
		}
	}
	for _, mv := range merged {
		mv = deref(mv)
		list := []*yaml.Node{mv}
		if mv.Kind == yaml.SequenceNode {
			list = mv.Content
		}
		for _, mm := range list {
			if k, v := lookupKey(mm, key); v != nil {
				return k, v
			}
		}
	}
	return nil, nil
}

// nodeAt is the node of a rule.FieldError path ("limit", "lease.ttl",
// "overrides[1].limit", "deny[0]") under the rule node n: a field's key, a
// list's element, or, for a field the file leaves out, the deepest node of
// the path it has.
func nodeAt(n *yaml.Node, path string) *yaml.Node {
	at, value := n, n
	for seg := range strings.SplitSeq(path, ".") {
		if seg == "" {
			break
		}
		name, index, hasIndex := strings.Cut(seg, "[")
		k, v := lookupKey(value, name)
		if v == nil {
			return at
		}
		at, value = k, v
		if hasIndex {
			i, err := strconv.Atoi(strings.TrimSuffix(index, "]"))
			list := deref(v)
			if err != nil || list.Kind != yaml.SequenceNode || i < 0 || i >= len(list.Content) {
				return at
			}
			at, value = list.Content[i], list.Content[i]
		}
	}
	return at
}
