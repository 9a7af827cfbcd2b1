package envoyrls

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// validKeys are the keys the reference accepts anywhere in a file (its check
// is flat: a known key is accepted at any depth and ignored where it does not
// belong), plus tokenserver's two extension fields.
var validKeys = map[string]bool{
	"domain":            true,
	"key":               true,
	"value":             true,
	"descriptors":       true,
	"rate_limit":        true,
	"unit":              true,
	"requests_per_unit": true,
	"unlimited":         true,
	"shadow_mode":       true,
	"quota_mode":        true,
	"name":              true,
	"replaces":          true,
	"detailed_metric":   true,
	"value_to_metric":   true,
	"share_threshold":   true,
	"metadata":          true,
	// tokenserver's extensions.
	"algorithm": true,
	"burst":     true,
}

type yamlReplaces struct {
	Name string `yaml:"name"`
}

type yamlRateLimit struct {
	RequestsPerUnit uint32         `yaml:"requests_per_unit"`
	Unit            string         `yaml:"unit"`
	Unlimited       bool           `yaml:"unlimited"`
	Name            string         `yaml:"name"`
	Replaces        []yamlReplaces `yaml:"replaces"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit"`
	Descriptors    []yamlDescriptor `yaml:"descriptors"`
	ShadowMode     bool             `yaml:"shadow_mode"`
	QuotaMode      bool             `yaml:"quota_mode"`
	DetailedMetric bool             `yaml:"detailed_metric"`
	ValueToMetric  bool             `yaml:"value_to_metric"`
	ShareThreshold bool             `yaml:"share_threshold"`
	Metadata       map[string]any   `yaml:"metadata"`
	Algorithm      string           `yaml:"algorithm"`
	Burst          uint64           `yaml:"burst"`

	line int
}

// UnmarshalYAML decodes a descriptor and remembers its line for errors.
func (d *yamlDescriptor) UnmarshalYAML(n *yaml.Node) error {
	type plain yamlDescriptor
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*d = yamlDescriptor(p)
	d.line = n.Line
	return nil
}

type yamlRoot struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
}

// ConfigError is a refused configuration file: which file, the line when one
// is known (0 otherwise), and the problem.
type ConfigError struct {
	File string
	Line int
	Msg  string
}

func (e *ConfigError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s: line %d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

func cfgErr(file string, line int, format string, args ...any) *ConfigError {
	return &ConfigError{File: file, Line: line, Msg: fmt.Sprintf(format, args...)}
}

// parseYAML reads one file the way the reference does: a generic walk that
// refuses unknown keys, non-string keys, lists of non-maps and scalar types
// other than string, int, bool and null; then a decode into the typed tree.
func parseYAML(file string, data []byte) (*yamlRoot, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, cfgErr(file, 0, "error loading config file: %v", err)
	}
	if doc.Kind == 0 { // empty file: the reference sees an empty map.
		return &yamlRoot{}, nil
	}
	root := doc.Content[0]
	root = deref(root)
	switch {
	case root.Kind == yaml.ScalarNode && root.Tag == "!!null":
		return &yamlRoot{}, nil
	case root.Kind != yaml.MappingNode:
		return nil, cfgErr(file, root.Line, "error loading config file: the document is a %s, not a map", kindName(root))
	}
	if err := validateKeys(file, root, 0); err != nil {
		return nil, err
	}
	var out yamlRoot
	if err := root.Decode(&out); err != nil {
		return nil, cfgErr(file, 0, "error loading config file: %v", err)
	}
	return &out, nil
}

// maxDepth bounds recursion over hostile input.
const maxDepth = 64

func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < maxDepth; i++ {
		n = n.Alias
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "list"
	case yaml.MappingNode:
		return "map"
	case yaml.ScalarNode:
		return "scalar " + strconv.Quote(n.Value)
	}
	return "node"
}

func validateKeys(file string, m *yaml.Node, depth int) error {
	if depth > maxDepth {
		return cfgErr(file, m.Line, "config error, nesting deeper than %d levels", maxDepth)
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := deref(m.Content[i]), deref(m.Content[i+1])
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			if err := validateMerge(file, v, depth); err != nil {
				return err
			}
			continue
		}
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			return cfgErr(file, k.Line, "config error, key is not of type string: %v", k.Value)
		}
		if !validKeys[k.Value] {
			return cfgErr(file, k.Line, "config error, unknown key '%s'", k.Value)
		}
		if k.Value == "metadata" {
			// Arbitrary content, checked when converted to a protobuf Struct.
			continue
		}
		if err := validateValue(file, v, depth); err != nil {
			return err
		}
	}
	return nil
}

func validateMerge(file string, v *yaml.Node, depth int) error {
	switch v.Kind {
	case yaml.MappingNode:
		return validateKeys(file, v, depth+1)
	case yaml.SequenceNode:
		for _, e := range v.Content {
			if err := validateMerge(file, deref(e), depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return cfgErr(file, v.Line, "error checking config")
}

func validateValue(file string, v *yaml.Node, depth int) error {
	switch v.Kind {
	case yaml.SequenceNode:
		for _, e := range v.Content {
			e = deref(e)
			if e.Kind != yaml.MappingNode {
				return cfgErr(file, e.Line, "config error, yaml file contains list of type other than map: %v", e.Value)
			}
			if err := validateKeys(file, e, depth+1); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		return validateKeys(file, v, depth+1)
	case yaml.ScalarNode:
		switch v.Tag {
		case "!!str", "!!bool", "!!null":
		case "!!int":
			var n int64
			if err := v.Decode(&n); err != nil {
				return cfgErr(file, v.Line, "error checking config")
			}
		default:
			return cfgErr(file, v.Line, "error checking config")
		}
	default:
		return cfgErr(file, v.Line, "error checking config")
	}
	return nil
}

// parseAlgorithm reads an algorithm as the project's rules spell it:
// token-bucket, TOKEN_BUCKET or token_bucket.
func parseAlgorithm(s string) (bucket.Algorithm, error) {
	return bucket.ParseAlgorithm(strings.ReplaceAll(strings.ToLower(s), "_", "-"))
}

// parseUnit reads a unit as the reference does (case-insensitive enum name,
// UNKNOWN excluded).
func parseUnit(s string) (Unit, bool) {
	v, ok := unitValue[strings.ToUpper(s)]
	return Unit(v), ok && Unit(v) != UnitUnknown
}

var unitValue = map[string]int32{
	"UNKNOWN": 0, "SECOND": 1, "MINUTE": 2, "HOUR": 3, "DAY": 4, "MONTH": 5, "YEAR": 6, "WEEK": 7,
}

// parseMetadata turns a descriptor's metadata into a protobuf Struct, as the
// reference does (non-string map keys are printed; a value Struct cannot hold
// refuses the file).
func parseMetadata(m map[string]any) (*structpb.Struct, error) {
	if len(m) == 0 {
		return nil, nil
	}
	conv, ok := convertAny(m, 0).(map[string]any)
	if !ok {
		return nil, fmt.Errorf("metadata is not a map")
	}
	return structpb.NewStruct(conv)
}

func convertAny(v any, depth int) any {
	if depth > maxDepth {
		return nil
	}
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = convertAny(e, depth+1)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[fmt.Sprintf("%v", k)] = convertAny(e, depth+1)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = convertAny(e, depth+1)
		}
		return out
	case uint64:
		return float64(t)
	case time.Time:
		return t.Format(time.RFC3339Nano)
	case float64:
		if math.IsNaN(t) || math.IsInf(t, 0) {
			return fmt.Sprint(t)
		}
		return t
	}
	return v
}
