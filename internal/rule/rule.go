// Package rule defines tokenserver's rules: the Rule type with its defaults and
// validation, the compiled Table the data plane reads, and the Store interface
// that keeps rules (in memory here, replicated by Raft in internal/raftfsm).
package rule

import (
	"errors"
	"fmt"
	"sort"
	"time"
	"unicode/utf8"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// Limits on what a rule may hold.
const (
	// MaxNameLen is the longest rule name.
	MaxNameLen = 128
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 256
	// MaxListLen is the most overrides, deny or allow entries a rule has.
	MaxListLen = 10_000
	// DefaultLogMaxKeys is MaxKeys for a sliding-log rule that sets none.
	DefaultLogMaxKeys = 10_000
	// DefaultConcurrencyMaxKeys is MaxKeys for a concurrency rule that sets
	// none: its leases cost memory per entry, like a sliding log's.
	DefaultConcurrencyMaxKeys = 10_000
	// MaxRuleBytes is the largest rule, as counted by EncodedSize: 1 MiB.
	MaxRuleBytes = 1 << 20
	// MaxLeaseTTL is the longest lease.ttl a rule may give clients: one day.
	MaxLeaseTTL = 24 * time.Hour
	// DefaultMaxRules is the default cap on rules per cluster.
	DefaultMaxRules = 10_000
)

// FallbackPolicy is what a client SDK does when it cannot reach the server.
type FallbackPolicy uint8

// The fallback policies; numbers match tokenserver.v1.FallbackPolicy.
const (
	// FallbackUnspecified lets the client decide (the SDK's option, else allow).
	FallbackUnspecified FallbackPolicy = iota
	// FallbackAllow admits everything.
	FallbackAllow
	// FallbackDeny denies everything.
	FallbackDeny
	// FallbackLocal throttles locally at Fallback.Limit per period per client.
	FallbackLocal
)

var fallbackNames = [...]string{"", "allow", "deny", "local"}

// String returns the policy as tokenctl spells it.
func (p FallbackPolicy) String() string {
	if int(p) < len(fallbackNames) {
		return fallbackNames[p]
	}
	return fmt.Sprintf("fallback(%d)", uint8(p))
}

// ParseFallbackPolicy reads "allow", "deny" or "local".
func ParseFallbackPolicy(s string) (FallbackPolicy, error) {
	for i, n := range fallbackNames {
		if i > 0 && n == s {
			return FallbackPolicy(i), nil
		}
	}
	return FallbackUnspecified, fmt.Errorf("unknown fallback policy %q (want allow, deny or local)", s)
}

// Rule is a named limit. Its zero value is not valid; see Validate.
type Rule struct {
	// Name is 1 to MaxNameLen characters of [A-Za-z0-9_.:/-].
	Name string `json:"name,omitempty"`
	// Algorithm is how the rule counts.
	Algorithm bucket.Algorithm `json:"algorithm,omitempty"`
	// Limit is permits per Period (leases at once for Concurrency).
	Limit int64 `json:"limit,omitempty"`
	// Period is the limit's period (a lease's lifetime for Concurrency).
	Period time.Duration `json:"period,omitempty"`
	// Burst is the capacity of token and leaky buckets; 0 means Limit.
	Burst int64 `json:"burst,omitempty"`
	// SampleCount is the sliding window's sub-windows; 0 means the default.
	SampleCount int64 `json:"sample_count,omitempty"`
	// Warmup turns on token-bucket warm-up.
	Warmup time.Duration `json:"warmup,omitempty"`
	// Penalty locks a key out for this long after its first denial.
	Penalty time.Duration `json:"penalty,omitempty"`
	// MaxKeys caps the keys the rule holds on one node; 0 means none (for
	// sliding log: DefaultLogMaxKeys).
	MaxKeys int64 `json:"max_keys,omitempty"`
	// Overrides give keys their own limit.
	Overrides []Override `json:"overrides,omitempty"`
	// Deny lists keys that are always denied.
	Deny []string `json:"deny,omitempty"`
	// Allow lists keys that are always allowed.
	Allow []string `json:"allow,omitempty"`
	// Shadow decides and counts but always allows.
	Shadow bool `json:"shadow,omitempty"`
	// Fallback is the clients' policy when the server is unreachable.
	Fallback Fallback `json:"fallback,omitempty"`
	// Lease caps client-side leasing.
	Lease Lease `json:"lease,omitempty"`
	// Calendar, for fixed-window rules, aligns windows to local calendar
	// days, ISO weeks or months in TimeZone; Period is then not needed.
	Calendar bucket.Calendar `json:"calendar,omitempty"`
	// TimeZone is the IANA zone of Calendar windows; "" means UTC.
	TimeZone string `json:"time_zone,omitempty"`
	// Inline lets a request carry its own limit, capped; zero refuses
	// request limits.
	Inline InlinePolicy `json:"inline,omitempty"`
	// ReservationTTL is how long a reservation (a grant) may be committed;
	// after it the grant stays charged at its estimate. 0 means the
	// rule's window (Period, or a calendar window's Span).
	ReservationTTL time.Duration `json:"reservation_ttl,omitempty"`
	// Durable replicates the rule's buckets to each key's next owner and
	// checkpoints them to the data dir, so that counts survive a crash of
	// the owner and a full restart (internal/replica). Meant for periods
	// of an hour or more and calendar quotas.
	Durable bool `json:"durable,omitempty"`
	// Version is the version of the rule's last change (set by the Store).
	Version uint64 `json:"version,omitempty"`
	// Generation is the version at which the rule was created (set by the
	// Store); buckets belong to one generation.
	Generation uint64 `json:"generation,omitempty"`
	// UpdatedBy is the principal that last wrote the rule (set by the
	// server from the caller's credential; empty without auth).
	UpdatedBy string `json:"updated_by,omitempty"`
}

// Override gives one key its own limit and burst.
type Override struct {
	Key   string `json:"key"`
	Limit int64  `json:"limit"`
	// Burst defaults to the override's Limit.
	Burst int64 `json:"burst,omitempty"`
}

// InlinePolicy caps the limits requests may carry under a rule
// (AcquireTokenRequest.limit). The zero value refuses them.
type InlinePolicy struct {
	// MaxLimit is the largest limit (and burst) a request may ask for;
	// 0 refuses request limits.
	MaxLimit int64 `json:"max_limit,omitempty"`
	// MaxPeriod is the longest period a request may ask for; 0 means the
	// rule's Period.
	MaxPeriod time.Duration `json:"max_period,omitempty"`
}

// Fallback is a rule's client-side fallback policy.
type Fallback struct {
	Policy FallbackPolicy `json:"policy,omitempty"`
	// Limit is, for FallbackLocal, what each client instance admits per
	// Period on its own.
	Limit int64 `json:"limit,omitempty"`
}

// Lease caps how much a client may lease and for how long; zero disables it.
type Lease struct {
	MaxBatch int64         `json:"max_batch,omitempty"`
	TTL      time.Duration `json:"ttl,omitempty"`
}

// Errors of the Store and of validation. Each is wrapped with context; test
// with errors.Is.
var (
	// ErrInvalid means a rule or request is malformed; the message says why.
	ErrInvalid = errors.New("invalid")
	// ErrNotFound means no rule has the name.
	ErrNotFound = errors.New("rule not found")
	// ErrVersionMismatch means an expected_version did not match.
	ErrVersionMismatch = errors.New("version mismatch")
	// ErrNoLeader means the write cannot be made now; retry.
	ErrNoLeader = errors.New("no leader")
)

// Invalid returns an error that is ErrInvalid (errors.Is) and whose message
// is the formatted text alone, as a person reads it.
func Invalid(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

// ValidName reports whether s may name a rule: 1 to MaxNameLen characters
// of [A-Za-z0-9_.:/-] ('/' namespaces names for scoped credentials:
// team-a/checkout).
func ValidName(s string) error {
	if s == "" {
		return Invalid("rule name is empty")
	}
	if len(s) > MaxNameLen {
		return Invalid("rule name is %d characters, above the limit of %d", len(s), MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == ':' || c == '-' || c == '/') {
			if c >= utf8.RuneSelf {
				return Invalid("rule name %q: byte %#x at %d is not one of [A-Za-z0-9_.:/-]", s, c, i)
			}
			return Invalid("rule name %q: character %q at %d is not one of [A-Za-z0-9_.:/-]", s, c, i)
		}
	}
	return nil
}

// ValidKey reports whether s may be a key.
func ValidKey(s string) error {
	if p := keyProblem(s); p != "" {
		return Invalid("%s", p)
	}
	return nil
}

func keyProblem(s string) string {
	if s == "" {
		return "key is empty"
	}
	if len(s) > MaxKeyLen {
		return fmt.Sprintf("key is %d bytes, above the limit of %d", len(s), MaxKeyLen)
	}
	if !utf8.ValidString(s) {
		return fmt.Sprintf("key %q is not valid UTF-8", s)
	}
	return ""
}

// Config returns the bucket configuration of the rule's default limit.
func (r *Rule) Config() bucket.Config {
	return bucket.Config{
		Algorithm:   r.Algorithm,
		Limit:       r.Limit,
		Period:      int64(r.Period),
		Burst:       r.Burst,
		SampleCount: r.SampleCount,
		Warmup:      int64(r.Warmup),
		Calendar:    r.Calendar,
		Location:    r.location(),
	}
}

// location is the rule's time zone for its bucket configuration: nil
// without a time zone (UTC for calendars), and nil too for a zone that
// does not load (Validate reports it).
func (r *Rule) location() *time.Location {
	if r.TimeZone == "" {
		return nil
	}
	loc, err := time.LoadLocation(r.TimeZone)
	if err != nil {
		return nil
	}
	return loc
}

// ReservationWindow is how long after it was made a grant of the rule may
// be committed: ReservationTTL, or by default the window of cfg (Span).
func (r *Rule) ReservationWindow(cfg *bucket.Config) int64 {
	if r.ReservationTTL > 0 {
		return int64(r.ReservationTTL)
	}
	return cfg.Span()
}

// overrideConfig returns the bucket configuration of an override of a
// rule whose default configuration is base.
func overrideConfig(base *bucket.Config, o Override) bucket.Config {
	c := *base
	c.Limit = o.Limit
	c.Burst = o.Burst
	if c.Burst == 0 {
		c.Burst = o.Limit
	}
	return c
}

// EffectiveMaxKeys is MaxKeys with the sliding-log and concurrency defaults
// applied; 0 is no cap.
func (r *Rule) EffectiveMaxKeys() int64 {
	if r.MaxKeys == 0 && r.Algorithm == bucket.SlidingLog {
		return DefaultLogMaxKeys
	}
	if r.MaxKeys == 0 && r.Algorithm == bucket.Concurrency {
		return DefaultConcurrencyMaxKeys
	}
	return r.MaxKeys
}

// EncodedSize is about the bytes the rule takes on the wire and in the Raft
// log (an upper estimate of its proto encoding), without encoding it.
func (r *Rule) EncodedSize() int {
	n := 128 + len(r.Name) // the scalar fields and their tags
	for _, o := range r.Overrides {
		n += len(o.Key) + 32
	}
	for _, k := range r.Deny {
		n += len(k) + 4
	}
	for _, k := range r.Allow {
		n += len(k) + 4
	}
	return n
}

// Validate reports the first problem with the rule: a *FieldError whose Path
// is the field, and which is ErrInvalid (errors.Is) with a message that
// names the rule and the field.
func (r *Rule) Validate() error {
	if err := ValidName(r.Name); err != nil {
		return &FieldError{Path: "name", Err: err}
	}
	if r.TimeZone != "" {
		if r.Calendar == bucket.CalendarNone {
			return r.fieldError("time_zone", "time_zone %q applies to calendar windows only; set calendar", r.TimeZone)
		}
		if _, err := time.LoadLocation(r.TimeZone); err != nil {
			return r.fieldError("time_zone", "time_zone %q is not an IANA time zone this server knows: %v", r.TimeZone, err)
		}
	}
	c := r.Config()
	if err := c.Validate(); err != nil {
		return r.fieldError(configField(err), "%v", err)
	}
	if err := r.validateCost(&c); err != nil {
		return err
	}
	switch {
	case r.Penalty < 0:
		return r.fieldError("penalty", "penalty must be >= 0, got %v", r.Penalty)
	case r.Penalty > time.Duration(bucket.MaxDuration):
		return r.fieldError("penalty", "penalty %v is above the longest supported duration %v (10 years)", r.Penalty, time.Duration(bucket.MaxDuration))
	case r.EncodedSize() > MaxRuleBytes:
		return r.fieldError("", "about %d bytes encoded, above the limit of %d (1 MiB); use fewer or shorter override, deny and allow keys", r.EncodedSize(), MaxRuleBytes)
	case r.MaxKeys < 0:
		return r.fieldError("max_keys", "max_keys must be >= 0, got %d", r.MaxKeys)
	case len(r.Overrides) > MaxListLen:
		return r.fieldError("overrides", "%d overrides, above the limit of %d", len(r.Overrides), MaxListLen)
	case len(r.Deny) > MaxListLen:
		return r.fieldError("deny", "%d deny entries, above the limit of %d", len(r.Deny), MaxListLen)
	case len(r.Allow) > MaxListLen:
		return r.fieldError("allow", "%d allow entries, above the limit of %d", len(r.Allow), MaxListLen)
	case r.Fallback.Policy > FallbackLocal:
		return r.fieldError("fallback.policy", "fallback.policy %d is unknown", r.Fallback.Policy)
	case r.Fallback.Limit < 0:
		return r.fieldError("fallback.limit", "fallback.limit must be >= 0, got %d", r.Fallback.Limit)
	case r.Fallback.Policy == FallbackLocal && r.Fallback.Limit == 0:
		return r.fieldError("fallback.limit", "fallback.limit must be > 0 with the local fallback policy")
	case r.Fallback.Policy != FallbackLocal && r.Fallback.Limit != 0:
		return r.fieldError("fallback.limit", "fallback.limit applies to the local fallback policy only")
	case r.Lease.MaxBatch < 0:
		return r.fieldError("lease.max_batch", "lease.max_batch must be >= 0, got %d", r.Lease.MaxBatch)
	case r.Lease.TTL < 0:
		return r.fieldError("lease.ttl", "lease.ttl must be >= 0, got %v", r.Lease.TTL)
	case r.Lease.TTL > MaxLeaseTTL:
		return r.fieldError("lease.ttl", "lease.ttl %v is above the limit of %v", r.Lease.TTL, MaxLeaseTTL)
	case r.Fallback.Limit > bucket.MaxLimit:
		return r.fieldError("fallback.limit", "fallback.limit %d is above the largest supported limit %d", r.Fallback.Limit, int64(bucket.MaxLimit))
	case r.Lease.MaxBatch > 0 && r.Lease.TTL == 0:
		return r.fieldError("lease.ttl", "lease.ttl must be > 0 when lease.max_batch is set")
	case r.Lease.MaxBatch > 0 && !leasable(r.Algorithm):
		return r.fieldError("lease.max_batch", "leases apply to token-bucket, fixed-window and sliding-window, not %s", r.Algorithm)
	case r.Lease.TTL > time.Duration(c.Span()):
		return r.fieldError("lease.ttl", "lease.ttl %v is longer than the period %v", r.Lease.TTL, time.Duration(c.Span()))
	case r.Lease.MaxBatch > c.Capacity():
		return r.fieldError("lease.max_batch", "lease.max_batch %d is above the capacity %d", r.Lease.MaxBatch, c.Capacity())
	}
	seen := make(map[string]struct{}, len(r.Overrides))
	for i, o := range r.Overrides {
		if p := keyProblem(o.Key); p != "" {
			return r.fieldError(fmt.Sprintf("overrides[%d].key", i), "overrides[%d]: %s", i, p)
		}
		if _, dup := seen[o.Key]; dup {
			return r.fieldError(fmt.Sprintf("overrides[%d].key", i), "overrides[%d]: key %q appears twice", i, o.Key)
		}
		seen[o.Key] = struct{}{}
		oc := overrideConfig(&c, o)
		if err := oc.Validate(); err != nil {
			return r.fieldError(fmt.Sprintf("overrides[%d].%s", i, configField(err)), "overrides[%d] (key %q): %v", i, o.Key, err)
		}
	}
	for _, l := range []struct {
		field string
		keys  []string
	}{{"deny", r.Deny}, {"allow", r.Allow}} {
		for i, k := range l.keys {
			if p := keyProblem(k); p != "" {
				at := fmt.Sprintf("%s[%d]", l.field, i)
				return r.fieldError(at, "%s: %s", at, p)
			}
		}
	}
	return nil
}

// validateCost checks the fields of cost accounting: the inline policy
// and the reservation TTL.
func (r *Rule) validateCost(c *bucket.Config) error {
	switch {
	case r.Inline.MaxLimit < 0:
		return r.fieldError("inline.max_limit", "inline.max_limit must be >= 0, got %d", r.Inline.MaxLimit)
	case r.Inline.MaxLimit > bucket.MaxLimit:
		return r.fieldError("inline.max_limit", "inline.max_limit %d is above the largest supported limit %d", r.Inline.MaxLimit, int64(bucket.MaxLimit))
	case r.Inline.MaxPeriod < 0:
		return r.fieldError("inline.max_period", "inline.max_period must be >= 0, got %v", r.Inline.MaxPeriod)
	case r.Inline.MaxPeriod > time.Duration(bucket.MaxDuration):
		return r.fieldError("inline.max_period", "inline.max_period %v is above the longest supported duration %v (10 years)", r.Inline.MaxPeriod, time.Duration(bucket.MaxDuration))
	case r.Inline.MaxPeriod > 0 && r.Inline.MaxLimit == 0:
		return r.fieldError("inline.max_limit", "inline.max_limit must be > 0 when inline.max_period is set")
	case r.Inline.MaxLimit > 0 && r.Calendar != bucket.CalendarNone:
		return r.fieldError("inline", "inline limits apply to period windows, not calendar ones")
	case r.ReservationTTL < 0:
		return r.fieldError("reservation_ttl", "reservation_ttl must be >= 0, got %v", r.ReservationTTL)
	case r.ReservationTTL > 0 && !bucket.OffersCommit(r.Algorithm):
		return r.fieldError("reservation_ttl", "reservation_ttl applies to rules that take commits (token-bucket, leaky-bucket, fixed-window, sliding-window), not %s", r.Algorithm)
	case r.ReservationTTL > time.Duration(c.Span()):
		return r.fieldError("reservation_ttl", "reservation_ttl %v is longer than the rule's window %v: a grant cannot be settled after its window", r.ReservationTTL, time.Duration(c.Span()))
	}
	return nil
}

// FieldError is a validation error about one field of a rule. Its message
// is Err's; Err is ErrInvalid (errors.Is). Find it with errors.As.
type FieldError struct {
	// Path is the field as tokenserver.v1.Rule names it (proto names):
	// "limit", "lease.ttl", "overrides[1].limit", "deny[0]"; "" for the
	// rule as a whole (its size). Indices are those of the rule validated.
	Path string
	// Err says what is wrong, naming the rule and the field.
	Err error
}

func (e *FieldError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// fieldError is a FieldError at path whose message is `rule "NAME": ` and
// the formatted text.
func (r *Rule) fieldError(path, format string, args ...any) error {
	return &FieldError{Path: path, Err: Invalid("rule %q: "+format, append([]any{r.Name}, args...)...)}
}

// configField is the field a bucket.Config validation error is about.
func configField(err error) string {
	var fe *bucket.FieldError
	if errors.As(err, &fe) {
		return fe.Field
	}
	return ""
}

func leasable(a bucket.Algorithm) bool {
	return a == bucket.TokenBucket || a == bucket.FixedWindow || a == bucket.SlidingWindow
}

// Clone returns a deep copy of r.
func (r *Rule) Clone() *Rule {
	c := *r
	c.Overrides = append([]Override(nil), r.Overrides...)
	c.Deny = append([]string(nil), r.Deny...)
	c.Allow = append([]string(nil), r.Allow...)
	return &c
}

// Normalize sorts the lists and drops duplicate deny and allow entries, so
// equal rules compare equal. It does not validate.
func (r *Rule) Normalize() {
	sort.Slice(r.Overrides, func(i, j int) bool { return r.Overrides[i].Key < r.Overrides[j].Key })
	r.Deny = sortedUnique(r.Deny)
	r.Allow = sortedUnique(r.Allow)
}

func sortedUnique(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	sort.Strings(s)
	out := s[:1]
	for _, v := range s[1:] {
		if v != out[len(out)-1] {
			out = append(out, v)
		}
	}
	return out
}
