package rulefile

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// The typed form of a rule in a file. Field names are tokenserver.v1.Rule's
// JSON names; the proto names of the fields whose JSON names differ are
// accepted too (both at once is an error, see checkFields). Every leaf type
// decodes one scalar and reports a problem at the scalar's line and column.

// ruleDoc is one rule as written.
type ruleDoc struct {
	Name             text        `yaml:"name"`
	Algorithm        algorithm   `yaml:"algorithm"`
	Limit            integer     `yaml:"limit"`
	Period           duration    `yaml:"period"`
	Burst            integer     `yaml:"burst"`
	SampleCount      int32Value  `yaml:"sampleCount"`
	SampleCountPB    int32Value  `yaml:"sample_count"`
	Warmup           duration    `yaml:"warmup"`
	Penalty          duration    `yaml:"penalty"`
	MaxKeys          integer     `yaml:"maxKeys"`
	MaxKeysPB        integer     `yaml:"max_keys"`
	Overrides        []override  `yaml:"overrides"`
	Deny             []text      `yaml:"deny"`
	Allow            []text      `yaml:"allow"`
	Shadow           boolean     `yaml:"shadow"`
	Fallback         fallbackDoc `yaml:"fallback"`
	Lease            leaseDoc    `yaml:"lease"`
	Calendar         calendar    `yaml:"calendar"`
	TimeZone         text        `yaml:"timeZone"`
	TimeZonePB       text        `yaml:"time_zone"`
	Inline           inlineDoc   `yaml:"inline"`
	ReservationTTL   duration    `yaml:"reservationTtl"`
	ReservationTTLPB duration    `yaml:"reservation_ttl"`
	Durable          boolean     `yaml:"durable"`
	// Output only (what 'rule list -o json' prints): read and ignored, as
	// the server ignores them.
	Version     uinteger `yaml:"version"`
	Generation  uinteger `yaml:"generation"`
	UpdatedBy   text     `yaml:"updatedBy"`
	UpdatedByPB text     `yaml:"updated_by"`
}

type override struct {
	Key   text    `yaml:"key"`
	Limit integer `yaml:"limit"`
	Burst integer `yaml:"burst"`
}

type fallbackDoc struct {
	Policy policy  `yaml:"policy"`
	Limit  integer `yaml:"limit"`
}

type leaseDoc struct {
	MaxBatch   integer  `yaml:"maxBatch"`
	MaxBatchPB integer  `yaml:"max_batch"`
	TTL        duration `yaml:"ttl"`
}

type inlineDoc struct {
	MaxLimit    integer  `yaml:"maxLimit"`
	MaxLimitPB  integer  `yaml:"max_limit"`
	MaxPeriod   duration `yaml:"maxPeriod"`
	MaxPeriodPB duration `yaml:"max_period"`
}

// listDoc is a document of the form {rules: [...]}, what 'rule list -o json'
// prints.
type listDoc struct {
	Rules []ruleDoc `yaml:"rules"`
}

// rule converts the typed form into a rule.Rule (not validated).
func (d *ruleDoc) rule() *rule.Rule {
	r := &rule.Rule{
		Name:        string(d.Name),
		Algorithm:   bucket.Algorithm(d.Algorithm),
		Limit:       int64(d.Limit),
		Period:      time.Duration(d.Period),
		Burst:       int64(d.Burst),
		SampleCount: int64(either(d.SampleCount, d.SampleCountPB)),
		Warmup:      time.Duration(d.Warmup),
		Penalty:     time.Duration(d.Penalty),
		MaxKeys:     int64(either(d.MaxKeys, d.MaxKeysPB)),
		Shadow:      bool(d.Shadow),
		Fallback:    rule.Fallback{Policy: rule.FallbackPolicy(d.Fallback.Policy), Limit: int64(d.Fallback.Limit)},
		Lease:       rule.Lease{MaxBatch: int64(either(d.Lease.MaxBatch, d.Lease.MaxBatchPB)), TTL: time.Duration(d.Lease.TTL)},
		Calendar:    bucket.Calendar(d.Calendar),
		TimeZone:    string(either(d.TimeZone, d.TimeZonePB)),
		Inline: rule.InlinePolicy{
			MaxLimit:  int64(either(d.Inline.MaxLimit, d.Inline.MaxLimitPB)),
			MaxPeriod: time.Duration(either(d.Inline.MaxPeriod, d.Inline.MaxPeriodPB)),
		},
		ReservationTTL: time.Duration(either(d.ReservationTTL, d.ReservationTTLPB)),
	}
	for _, o := range d.Overrides {
		r.Overrides = append(r.Overrides, rule.Override{Key: string(o.Key), Limit: int64(o.Limit), Burst: int64(o.Burst)})
	}
	for _, k := range d.Deny {
		r.Deny = append(r.Deny, string(k))
	}
	for _, k := range d.Allow {
		r.Allow = append(r.Allow, string(k))
	}
	return r
}

// either is the JSON-named field's value, or else the proto-named one's (at
// most one of them is set).
func either[T comparable](json, proto T) T {
	var zero T
	if json != zero {
		return json
	}
	return proto
}

// posError is a problem at a node of the file.
type posError struct {
	line, col int
	msg       string
}

func (e *posError) Error() string { return e.msg }

func errorAt(n *yaml.Node, format string, args ...any) error {
	return &posError{line: n.Line, col: n.Column, msg: fmt.Sprintf(format, args...)}
}

// kindName names a node's kind for messages.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	return fmt.Sprintf("%q", n.Value)
}

// scalarOf checks that n is a scalar and returns its value.
func scalarOf(n *yaml.Node, want string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", errorAt(n, "want %s, got %s", want, kindName(n))
	}
	return n.Value, nil
}

// text is a string field: a YAML string (a number or a bool must be quoted,
// as the proto's JSON form requires).
type text string

func (t *text) UnmarshalYAML(n *yaml.Node) error {
	if _, err := scalarOf(n, "a string"); err != nil {
		return err
	}
	if n.ShortTag() != "!!str" {
		return errorAt(n, "want a string, got %s (quote it)", n.Value)
	}
	*t = text(n.Value)
	return nil
}

// parseInt reads an integer scalar: a YAML integer, or a string of decimal
// digits (the proto's JSON form of 64-bit integers).
func parseInt(n *yaml.Node, bits int) (int64, error) {
	s, err := scalarOf(n, "an integer")
	if err != nil {
		return 0, err
	}
	var v int64
	switch n.ShortTag() {
	case "!!int":
		err = n.Decode(&v)
	case "!!str":
		v, err = strconv.ParseInt(s, 10, 64)
	default:
		return 0, errorAt(n, "want an integer, got %s", s)
	}
	if err != nil || bits < 64 && (v > math.MaxInt32 || v < math.MinInt32) {
		return 0, errorAt(n, "want an integer of %d bits, got %s", bits, s)
	}
	return v, nil
}

// integer is an int64 field.
type integer int64

func (i *integer) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseInt(n, 64)
	*i = integer(v)
	return err
}

// int32Value is an int32 field.
type int32Value int32

func (i *int32Value) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseInt(n, 32)
	*i = int32Value(v)
	return err
}

// uinteger is a uint64 field.
type uinteger uint64

func (u *uinteger) UnmarshalYAML(n *yaml.Node) error {
	s, err := scalarOf(n, "an unsigned integer")
	if err != nil {
		return err
	}
	var v uint64
	switch n.ShortTag() {
	case "!!int":
		err = n.Decode(&v)
	case "!!str":
		v, err = strconv.ParseUint(s, 10, 64)
	default:
		err = fmt.Errorf("not an integer")
	}
	if err != nil {
		return errorAt(n, "want an unsigned integer, got %s", s)
	}
	*u = uinteger(v)
	return nil
}

// boolean is a bool field.
type boolean bool

func (b *boolean) UnmarshalYAML(n *yaml.Node) error {
	s, err := scalarOf(n, "true or false")
	if err != nil {
		return err
	}
	var v bool // yaml.v3 reads YAML 1.1's yes, on, ... into a bool too
	if n.Decode(&v) != nil {
		return errorAt(n, "want true or false, got %s", s)
	}
	*b = boolean(v)
	return nil
}

// duration is a google.protobuf.Duration field, written as Go writes
// durations (1m30s, 250ms) or as the proto's JSON form ("90s", "0.25s").
type duration time.Duration

func (d *duration) UnmarshalYAML(n *yaml.Node) error {
	s, err := scalarOf(n, "a duration")
	if err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil || n.ShortTag() != "!!str" {
		return errorAt(n, "want a duration like 1s, 250ms or 1m30s (under 292 years), got %s", s)
	}
	*d = duration(v)
	return nil
}

// algorithm is an Algorithm field: TOKEN_BUCKET, token-bucket or
// token_bucket (any case), or the enum's number.
type algorithm bucket.Algorithm

func (a *algorithm) UnmarshalYAML(n *yaml.Node) error {
	s, err := scalarOf(n, "an algorithm")
	if err != nil {
		return err
	}
	if n.ShortTag() == "!!int" {
		v, err := parseInt(n, 32)
		if err != nil || v < 0 || v > int64(bucket.Concurrency) {
			return errorAt(n, "unknown algorithm %s", s)
		}
		*a = algorithm(v)
		return nil
	}
	if strings.EqualFold(s, "ALGORITHM_UNSPECIFIED") {
		*a = algorithm(bucket.Unspecified)
		return nil
	}
	v, err := bucket.ParseAlgorithm(strings.ReplaceAll(strings.ToLower(s), "_", "-"))
	if err != nil {
		return errorAt(n, "unknown algorithm %q (want TOKEN_BUCKET, LEAKY_BUCKET, FIXED_WINDOW, SLIDING_WINDOW, SLIDING_LOG or CONCURRENCY; token-bucket ... works too)", s)
	}
	*a = algorithm(v)
	return nil
}

// policy is a FallbackPolicy field: LOCAL, local, ... or the enum's number.
type policy rule.FallbackPolicy

func (p *policy) UnmarshalYAML(n *yaml.Node) error {
	s, err := scalarOf(n, "a fallback policy")
	if err != nil {
		return err
	}
	if n.ShortTag() == "!!int" {
		v, err := parseInt(n, 32)
		if err != nil || v < 0 || v > int64(rule.FallbackLocal) {
			return errorAt(n, "unknown fallback policy %s", s)
		}
		*p = policy(v)
		return nil
	}
	if strings.EqualFold(s, "FALLBACK_POLICY_UNSPECIFIED") {
		*p = policy(rule.FallbackUnspecified)
		return nil
	}
	v, err := rule.ParseFallbackPolicy(strings.ToLower(s))
	if err != nil {
		return errorAt(n, "unknown fallback policy %q (want LOCAL, ALLOW or DENY, in any case)", s)
	}
	*p = policy(v)
	return nil
}

// calendar is a Calendar field: MONTH, month (any case), or the enum's
// number.
type calendar bucket.Calendar

func (c *calendar) UnmarshalYAML(n *yaml.Node) error {
	s, err := scalarOf(n, "a calendar")
	if err != nil {
		return err
	}
	if n.ShortTag() == "!!int" {
		v, err := parseInt(n, 32)
		if err != nil || v < 0 || v > int64(bucket.CalendarMonth) {
			return errorAt(n, "unknown calendar %s", s)
		}
		*c = calendar(v)
		return nil
	}
	if strings.EqualFold(s, "CALENDAR_UNSPECIFIED") {
		*c = calendar(bucket.CalendarNone)
		return nil
	}
	v, err := bucket.ParseCalendar(strings.ToLower(s))
	if err != nil {
		return errorAt(n, "unknown calendar %q (want DAY, WEEK or MONTH, in any case)", s)
	}
	*c = calendar(v)
	return nil
}
