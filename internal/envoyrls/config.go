package envoyrls

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"google.golang.org/protobuf/types/known/structpb"
)

// Meta is what tokenserver records about a domain besides its YAML: its
// version (the Raft index of its last change, 0 before it is stored), who
// wrote it (a principal, or "file:NAME" for --envoy-config-dir) and the file
// it came from.
type Meta struct {
	Version uint64 `json:"version"`
	Author  string `json:"author"`
	Source  string `json:"source"`
}

// Domain is one parsed configuration file: a domain and its descriptor tree,
// with the YAML it was read from. It is immutable.
type Domain struct {
	name string
	yaml []byte
	meta Meta
	root *node
}

// Name is the domain's name.
func (d *Domain) Name() string { return d.name }

// YAML is the file the domain was parsed from, unchanged. The caller must not
// modify it.
func (d *Domain) YAML() []byte { return d.yaml }

// Meta is the domain's version, author and source.
func (d *Domain) Meta() Meta { return d.meta }

// WithMeta returns a copy of d carrying m.
func (d *Domain) WithMeta(m Meta) *Domain {
	c := *d
	c.meta = m
	return &c
}

// node is one level of the descriptor tree.
type node struct {
	children  map[string]*node // by "key" or "key_value", as the reference keys them
	wildcards []wildcard       // children whose value holds a '*', in file order
	limit     *spec
	// valueToMetric, shareThreshold and pattern are the descriptor's flags;
	// pattern is its "key_value*" when shareThreshold is set.
	valueToMetric  bool
	shareThreshold bool
	pattern        string
	metadata       *structpb.Struct
}

type wildcard struct {
	key   string   // the child's map key, e.g. "path_bar*baz"
	parts []string // key split on '*'
}

// spec is a configured rate_limit block with its descriptor's flags.
type spec struct {
	fullKey         string // domain.key_value.key: the reference's stats key
	unit            Unit
	requestsPerUnit uint32
	unlimited       bool
	name            string
	replaces        []string
	shadow          bool
	quota           bool
	detailed        bool
	algorithm       bucket.Algorithm
	burst           int64
	// stats caches the metric counters of the rule label (Metrics.stats).
	stats atomic.Pointer[ruleStats]
}

// ParseDomain parses one envoyproxy/ratelimit YAML file. It refuses what the
// reference refuses, with an error (a *ConfigError) naming file, the line
// when known, and the problem; and it refuses a bad tokenserver extension
// (algorithm, burst).
func ParseDomain(file string, data []byte, meta Meta) (*Domain, error) {
	y, err := parseYAML(file, data)
	if err != nil {
		return nil, err
	}
	if y.Domain == "" {
		return nil, cfgErr(file, 0, "config file cannot have empty domain")
	}
	root := &node{children: map[string]*node{}}
	if err := root.load(file, y.Domain+".", y.Descriptors); err != nil {
		return nil, err
	}
	if meta.Source == "" {
		meta.Source = file
	}
	return &Domain{name: y.Domain, yaml: append([]byte(nil), data...), meta: meta, root: root}, nil
}

func (n *node) load(file, parentKey string, ds []yamlDescriptor) error {
	for _, d := range ds {
		if d.Key == "" {
			return cfgErr(file, d.line, "descriptor has empty key")
		}
		finalKey := d.Key
		if d.Value != "" {
			finalKey += "_" + d.Value
		}
		fullKey := parentKey + finalKey
		if _, dup := n.children[finalKey]; dup {
			return cfgErr(file, d.line, "duplicate descriptor composite key '%s'", fullKey)
		}
		child := &node{
			children:       map[string]*node{},
			valueToMetric:  d.ValueToMetric,
			shareThreshold: d.ShareThreshold,
		}
		if d.RateLimit != nil {
			s, err := loadSpec(file, fullKey, d)
			if err != nil {
				return err
			}
			child.limit = s
		} else if d.Algorithm != "" || d.Burst != 0 {
			return cfgErr(file, d.line, "algorithm and burst need a rate_limit block on the same descriptor")
		}
		if d.ShareThreshold {
			if !strings.Contains(finalKey, "*") {
				return cfgErr(file, d.line, "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", finalKey)
			}
			child.pattern = finalKey
		}
		if strings.Contains(finalKey, "*") {
			n.wildcards = append(n.wildcards, wildcard{key: finalKey, parts: strings.Split(finalKey, "*")})
		}
		md, err := parseMetadata(d.Metadata)
		if err != nil {
			return cfgErr(file, d.line, "error parsing metadata: %v", err)
		}
		child.metadata = md
		if err := child.load(file, fullKey+".", d.Descriptors); err != nil {
			return err
		}
		n.children[finalKey] = child
	}
	return nil
}

func loadSpec(file, fullKey string, d yamlDescriptor) (*spec, error) {
	rl := d.RateLimit
	unit, validUnit := parseUnit(rl.Unit)
	if rl.Unlimited {
		if validUnit {
			return nil, cfgErr(file, d.line, "should not specify rate limit unit when unlimited")
		}
		unit = UnitUnknown
	} else if !validUnit {
		return nil, cfgErr(file, d.line, "invalid rate limit unit '%s'", rl.Unit)
	}
	s := &spec{
		fullKey:         fullKey,
		unit:            unit,
		requestsPerUnit: rl.RequestsPerUnit,
		unlimited:       rl.Unlimited,
		name:            rl.Name,
		shadow:          d.ShadowMode,
		quota:           d.QuotaMode,
		detailed:        d.DetailedMetric,
		algorithm:       bucket.FixedWindow,
	}
	for _, r := range rl.Replaces {
		if r.Name == "" {
			return nil, cfgErr(file, d.line, "should not have an empty replaces entry")
		}
		if r.Name == rl.Name {
			return nil, cfgErr(file, d.line, "replaces should not contain name of same descriptor")
		}
		s.replaces = append(s.replaces, r.Name)
	}
	if d.Algorithm == "" && d.Burst == 0 {
		return s, nil
	}
	if rl.Unlimited {
		return nil, cfgErr(file, d.line, "algorithm and burst do not apply to an unlimited rate_limit")
	}
	if d.Algorithm != "" {
		a, err := parseAlgorithm(d.Algorithm)
		if err != nil {
			return nil, cfgErr(file, d.line, "algorithm: %v", err)
		}
		s.algorithm = a
	}
	if d.Burst > bucket.MaxLimit {
		return nil, cfgErr(file, d.line, "burst %d is above the largest supported burst %d (2^53)", d.Burst, int64(bucket.MaxLimit))
	}
	s.burst = int64(d.Burst)
	if s.burst > 0 && s.algorithm != bucket.TokenBucket && s.algorithm != bucket.LeakyBucket {
		return nil, cfgErr(file, d.line, "burst applies to token-bucket and leaky-bucket, not %s", s.algorithm)
	}
	if rl.RequestsPerUnit > 0 {
		bc := s.BucketConfig()
		if err := bc.Validate(); err != nil {
			return nil, cfgErr(file, d.line, "%s: %v", s.algorithm, err)
		}
	}
	return s, nil
}

// BucketConfig is the tokenserver bucket a configured limit stands for.
func (s *spec) BucketConfig() bucket.Config {
	return bucket.Config{
		Algorithm: s.algorithm,
		Limit:     int64(s.requestsPerUnit),
		Period:    int64(Period(s.unit)),
		Burst:     s.burst,
	}
}

// Config is every domain in force. It is immutable: With and Without return
// new values, so readers may share one without locks.
type Config struct {
	domains map[string]*Domain
}

// NewConfig builds a Config from parsed domains, refusing a domain that
// appears twice as the reference does (it has no MERGE_DOMAIN_CONFIG here).
func NewConfig(ds ...*Domain) (*Config, error) {
	c := &Config{domains: make(map[string]*Domain, len(ds))}
	for _, d := range ds {
		if prev, ok := c.domains[d.name]; ok {
			return nil, cfgErr(d.meta.Source, 0, "duplicate domain '%s' in config file (already in %s)", d.name, prev.meta.Source)
		}
		c.domains[d.name] = d
	}
	return c, nil
}

// Domain returns the named domain, or nil.
func (c *Config) Domain(name string) *Domain {
	if c == nil {
		return nil
	}
	return c.domains[name]
}

// Domains lists the domains sorted by name.
func (c *Config) Domains() []*Domain {
	if c == nil {
		return nil
	}
	out := make([]*Domain, 0, len(c.domains))
	for _, d := range c.domains {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// Len is the number of domains.
func (c *Config) Len() int {
	if c == nil {
		return 0
	}
	return len(c.domains)
}

// With returns a Config in which d replaces any domain of the same name.
func (c *Config) With(d *Domain) *Config {
	n := &Config{domains: make(map[string]*Domain, c.Len()+1)}
	if c != nil {
		for k, v := range c.domains {
			n.domains[k] = v
		}
	}
	n.domains[d.name] = d
	return n
}

// Without returns a Config without the named domain.
func (c *Config) Without(name string) *Config {
	n := &Config{domains: make(map[string]*Domain, c.Len())}
	if c != nil {
		for k, v := range c.domains {
			if k != name {
				n.domains[k] = v
			}
		}
	}
	return n
}

// storedDomain is a domain as Marshal writes it.
type storedDomain struct {
	Domain string `json:"domain"`
	YAML   string `json:"yaml"`
	Meta
}

// Marshal serializes c deterministically (domains sorted by name, each as
// its source YAML plus its Meta), for Raft log entries and snapshots.
func (c *Config) Marshal() ([]byte, error) {
	ds := c.Domains()
	out := make([]storedDomain, len(ds))
	for i, d := range ds {
		out[i] = storedDomain{Domain: d.name, YAML: string(d.yaml), Meta: d.meta}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("marshal envoy config: %w", err)
	}
	return b, nil
}

// UnmarshalConfig reads what Marshal wrote, parsing every domain again.
func UnmarshalConfig(b []byte) (*Config, error) {
	var in []storedDomain
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("unmarshal envoy config: %w", err)
	}
	ds := make([]*Domain, 0, len(in))
	for _, s := range in {
		d, err := ParseDomain(s.Source, []byte(s.YAML), s.Meta)
		if err != nil {
			return nil, fmt.Errorf("unmarshal envoy config: %w", err)
		}
		if d.name != s.Domain {
			return nil, fmt.Errorf("unmarshal envoy config: stored as domain %q but the YAML says %q", s.Domain, d.name)
		}
		ds = append(ds, d)
	}
	c, err := NewConfig(ds...)
	if err != nil {
		return nil, fmt.Errorf("unmarshal envoy config: %w", err)
	}
	return c, nil
}

// ParseFiles parses several files into one Config, as the reference loads a
// directory: every bad file is reported (errors.Join, in the order given)
// and any error refuses the whole set.
func ParseFiles(files []File) (*Config, error) {
	var errs []error
	ds := make([]*Domain, 0, len(files))
	for _, f := range files {
		d, err := ParseDomain(f.Name, f.Data, f.Meta)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ds = append(ds, d)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return NewConfig(ds...)
}

// File is one configuration file to parse.
type File struct {
	Name string
	Data []byte
	Meta Meta
}
