package envoyrls

import (
	"strconv"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/tokenserver/tokenserver/internal/bucket"
	"google.golang.org/protobuf/types/known/structpb"
)

// OverrideRule is the rule label of limits a request brings itself
// (descriptor.limit): the reference's stats key for them holds the request's
// values, which would make labels unbounded.
const OverrideRule = "(override)"

// Limit is the limit that applies to one request descriptor.
type Limit struct {
	// Domain is the request's domain.
	Domain string
	// Key is the reference's cache key without its window suffix:
	// "domain_key1_value1_key2_value2_" built from the request's entries
	// (a share_threshold entry contributes its wildcard pattern instead of
	// its value). Counters with the same Key and Unit are one counter in the
	// reference, and so here: see CounterKey.
	Key string
	// Unit and RequestsPerUnit are the limit.
	Unit            Unit
	RequestsPerUnit uint32
	// Name is the rate_limit's name ("" if none, and for overrides).
	Name string
	// Replaces lists the names this limit replaces.
	Replaces []string
	// Unlimited: the descriptor is counted nowhere and answers OK.
	Unlimited bool
	// Shadow: decided and counted, but answered OK.
	Shadow bool
	// Quota is the reference's quota_mode.
	Quota bool
	// Override: the request brought this limit (descriptor.limit).
	Override bool
	// Algorithm is tokenserver's extension; FixedWindow unless configured.
	Algorithm bucket.Algorithm
	// Burst is tokenserver's extension (0: the bucket's default).
	Burst int64
	// Rule is the metrics label of the configured limit: its path in the
	// file without the domain ("key1_value1.subkey1"), or OverrideRule.
	Rule string
	// DetailedRule is set when the descriptor asks for detailed_metric or
	// value_to_metric: the reference's metric key, holding request values,
	// which Metrics uses under a cap.
	DetailedRule string
	// Metadata is the descriptor's metadata, if any.
	Metadata *structpb.Struct

	// counterKey is CounterKey, set by Resolve with Key.
	counterKey string
	// spec is the configured limit Resolve matched (nil for overrides); it
	// caches the metric counters of its rule label.
	spec *spec
}

// CounterKey identifies the limit's counter across windows: the Key plus the
// unit, plus the algorithm when it is not a fixed window. The reference's
// cache key is CacheKey. Resolve builds it with the Key, in one allocation;
// a Limit built otherwise computes it on each call.
func (l *Limit) CounterKey() string {
	if l.counterKey != "" {
		return l.counterKey
	}
	k := l.Key + unitName(l.Unit)
	if l.Algorithm != bucket.FixedWindow {
		k += "_" + l.Algorithm.String()
	}
	return k
}

// HashKeyOf is the HashKey of a limit of unit and algorithm alg whose
// CounterKey is counterKey: the counter key without the suffix CounterKey
// adds. ok is false when counterKey does not end with that suffix.
func HashKeyOf(counterKey string, unit Unit, alg bucket.Algorithm) (hashKey string, ok bool) {
	suffix := unitName(unit)
	if alg != bucket.FixedWindow {
		suffix += "_" + alg.String()
	}
	return strings.CutSuffix(counterKey, suffix)
}

// unitName is u.String() for the units a limit may have, without the
// protobuf enum lookup; any other value falls back to it.
func unitName(u Unit) string {
	switch u {
	case UnitSecond:
		return "SECOND"
	case UnitMinute:
		return "MINUTE"
	case UnitHour:
		return "HOUR"
	case UnitDay:
		return "DAY"
	case UnitWeek:
		return "WEEK"
	case UnitMonth:
		return "MONTH"
	case UnitYear:
		return "YEAR"
	}
	return u.String()
}

// setKeys sets l.Key to the reference's cache key base of entries
// (cacheKeyBase) and l.counterKey to CounterKey, sharing one string.
// l.Unit and l.Algorithm must be set.
func (l *Limit) setKeys(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, patterns []string) {
	unit := unitName(l.Unit)
	alg := ""
	if l.Algorithm != bucket.FixedWindow {
		alg = l.Algorithm.String()
	}
	n := len(domain) + 1 + len(unit) + len(alg) + 1
	for _, e := range entries {
		n += len(e.GetKey()) + len(e.GetValue()) + 2
	}
	for _, p := range patterns {
		n += len(p)
	}
	var b strings.Builder
	b.Grow(n)
	writeCacheKeyBase(&b, domain, entries, patterns)
	keyLen := b.Len()
	b.WriteString(unit)
	if alg != "" {
		b.WriteByte('_')
		b.WriteString(alg)
	}
	s := b.String()
	l.Key, l.counterKey = s[:keyLen], s
}

// CacheKey is the reference's exact cache key at nowUnix (without its
// CACHE_KEY_PREFIX): Key followed by the window's start.
func (l *Limit) CacheKey(nowUnix int64) string {
	return l.Key + strconv.FormatInt(WindowStart(l.Unit, nowUnix), 10)
}

// HashKey is the key whose hash picks the node owning the counter: the same
// for every unit and algorithm of one descriptor, so a request's override and
// configured limits land on one node.
func (l *Limit) HashKey() string { return l.Key }

// BucketConfig is the tokenserver bucket the limit stands for.
func (l *Limit) BucketConfig() bucket.Config {
	return bucket.Config{
		Algorithm: l.Algorithm,
		Limit:     int64(l.RequestsPerUnit),
		Period:    int64(Period(l.Unit)),
		Burst:     l.Burst,
	}
}

// Resolve finds the limit of one descriptor in a domain, as the reference's
// GetLimit does: nil when the domain is unknown or nothing matches (the
// descriptor is not limited). A request's own limit (descriptor.limit) wins
// over the configuration. The caller validates the request first
// (ValidateRequest); an override with an invalid unit returns nil.
func (c *Config) Resolve(domain string, desc *ratelimitv3.RateLimitDescriptor) *Limit {
	d := c.Domain(domain)
	if d == nil {
		return nil
	}
	l := new(Limit)
	if !d.resolve(l, desc) {
		return nil
	}
	return l
}

// resolve is Resolve in d, into l (which it overwrites): false when the
// descriptor is not limited. It allocates only the limit's keys on the
// common path; the per-entry lookups and metric names are built on the
// stack.
func (d *Domain) resolve(l *Limit, desc *ratelimitv3.RateLimitDescriptor) bool {
	domain := d.name
	entries := desc.GetEntries()
	if o := desc.GetLimit(); o != nil {
		u := Unit(o.GetUnit())
		if !ValidUnit(u) {
			return false
		}
		*l = Limit{
			Domain:          domain,
			Unit:            u,
			RequestsPerUnit: o.GetRequestsPerUnit(),
			Override:        true,
			Algorithm:       bucket.FixedWindow,
			Rule:            OverrideRule,
		}
		l.setKeys(domain, entries, nil)
		return true
	}

	children := d.root.children
	prev := d.root
	var found *spec
	var foundNode *node
	var shared map[int]string // entry index → share_threshold pattern value
	// valueMetric is the reference's value-to-metric stats key
	// (domain.key_value.key...), built without allocating while short.
	var vmBuf, fkBuf [128]byte
	valueMetric := append(vmBuf[:0], domain...)

	for i, e := range entries {
		fk := append(fkBuf[:0], e.GetKey()...)
		fk = append(fk, '_')
		fk = append(fk, e.GetValue()...)

		next := children[string(fk)]
		matchedWildcard := ""
		if next == nil && len(prev.wildcards) > 0 {
			finalKey := string(fk)
			for _, w := range prev.wildcards {
				if wildcardMatch(w.parts, finalKey) {
					next = children[w.key]
					matchedWildcard = w.key
					break
				}
			}
		}
		byValue := next != nil
		if next == nil {
			next = children[e.GetKey()]
		}
		if matchedWildcard != "" && next != nil && next.shareThreshold && next.pattern != "" {
			if shared == nil {
				shared = map[int]string{}
			}
			shared[i] = strings.TrimPrefix(next.pattern, e.GetKey()+"_")
		}

		valueMetric = append(valueMetric, '.')
		valueMetric = append(valueMetric, e.GetKey()...)
		if next != nil {
			v := ""
			switch {
			case matchedWildcard != "" && shared[i] != "":
				v = shared[i]
			case matchedWildcard != "" && next.valueToMetric:
				v = e.GetValue()
			case matchedWildcard != "":
				v = strings.TrimPrefix(matchedWildcard, e.GetKey()+"_")
			case byValue:
				v = e.GetValue()
			case next.valueToMetric:
				v = e.GetValue()
			}
			if v != "" {
				valueMetric = append(valueMetric, '_')
				valueMetric = append(valueMetric, v...)
			}
		}

		if next != nil && next.limit != nil && i == len(entries)-1 {
			found, foundNode = next.limit, next
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		children = next.children
		prev = next
	}
	if found == nil {
		return false
	}

	var patterns []string
	if len(shared) > 0 {
		patterns = make([]string, len(entries))
		for i, p := range shared {
			patterns[i] = p
		}
	}
	// found.fullKey and the metric keys all start with "domain." (a match
	// has at least one entry): the rule labels are what follows.
	*l = Limit{
		Domain:          domain,
		Unit:            found.unit,
		RequestsPerUnit: found.requestsPerUnit,
		Name:            found.name,
		Replaces:        found.replaces,
		Unlimited:       found.unlimited,
		Shadow:          found.shadow,
		Quota:           found.quota,
		Algorithm:       found.algorithm,
		Burst:           found.burst,
		Rule:            found.fullKey[len(domain)+1:],
		Metadata:        foundNode.metadata,
		spec:            found,
	}
	l.setKeys(domain, entries, patterns)
	switch {
	case found.detailed && len(shared) > 0:
		var b strings.Builder
		b.WriteString(domain)
		for i, e := range entries {
			b.WriteString(".")
			b.WriteString(e.GetKey())
			if patterns[i] != "" {
				b.WriteString("_" + patterns[i])
			} else if e.GetValue() != "" {
				b.WriteString("_" + e.GetValue())
			}
		}
		l.DetailedRule = strings.TrimPrefix(b.String(), domain+".")
	case found.detailed:
		// The reference's detailed key: domain.key_value for every entry.
		var b strings.Builder
		for i, e := range entries {
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(e.GetKey())
			b.WriteByte('_')
			b.WriteString(e.GetValue())
		}
		l.DetailedRule = b.String()
	default:
		if string(valueMetric) != found.fullKey {
			l.DetailedRule = string(valueMetric[len(domain)+1:])
		}
	}
	return true
}

// writeCacheKeyBase writes the reference's cache key up to the window:
// domain_key_value_key_value_, with share_threshold patterns in place of
// values where patterns has one.
func writeCacheKeyBase(b *strings.Builder, domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, patterns []string) {
	b.WriteString(domain)
	b.WriteByte('_')
	for i, e := range entries {
		b.WriteString(e.GetKey())
		b.WriteByte('_')
		v := e.GetValue()
		if i < len(patterns) && patterns[i] != "" {
			v = patterns[i]
		}
		b.WriteString(v)
		b.WriteByte('_')
	}
}

// wildcardMatch reports whether value matches a pattern split on '*'; each
// '*' matches zero or more bytes, in order.
func wildcardMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	if !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	if len(value) < total {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
