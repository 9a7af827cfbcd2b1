package console

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fakeBackend is an in-memory cluster of three members with rules,
// versions, history and series. It authenticates and authorizes like the
// node: tokens and certificate common names map to principals, roles
// imply (admin ⊃ editor ⊃ viewer), and errors carry gRPC codes.
type fakeBackend struct {
	clock *fakeClock
	// loopbackOpen admits callers from loopback with no credential.
	loopbackOpen bool

	mu      sync.Mutex
	tokens  map[string]Principal
	certs   map[string]Principal // certificate common name → principal
	index   uint64               // like the Raft index: every write bumps it
	rules   map[string]Rule
	history map[string][]RuleVersion // newest first
	series  map[string][]Point
	top     map[string][]TopKey
	creds   []Credential // every credential seen, for assertions
	// overrides are fakeFullBackend's, nil until the first call.
	overrides []Override
}

func newFakeBackend(clock *fakeClock) *fakeBackend {
	b := &fakeBackend{
		clock: clock,
		tokens: map[string]Principal{
			"viewer-secret-token": {Name: "vera", Roles: []string{"viewer"}},
			"editor-secret-token": {Name: "eddie", Roles: []string{"editor"}},
		},
		certs:   map[string]Principal{"ops-cert": {Name: "ops-cert", Roles: []string{"viewer"}}},
		rules:   map[string]Rule{},
		history: map[string][]RuleVersion{},
		series:  map[string][]Point{},
		top:     map[string][]TopKey{},
	}
	for _, def := range []string{
		"name: api\nalgorithm: TOKEN_BUCKET\nlimit: 100\nperiod: 1s\n",
		"name: login\nalgorithm: SLIDING_LOG\nlimit: 5\nperiod: 1m\n",
	} {
		if _, err := b.put("seed", def, 0); err != nil {
			panic(err)
		}
	}
	b.top["api"] = []TopKey{{Key: "user-1", Count: 900, ErrorBound: 3}, {Key: "user-2", Count: 400, ErrorBound: 3}}
	b.top["api/denied"] = []TopKey{{Key: "user-1", Count: 77, ErrorBound: 1}}
	return b
}

// addRules adds n generated rules with live figures and sparklines.
func (b *fakeBackend) addRules(n int) {
	for i := range n {
		def := fmt.Sprintf("name: gen-%04d\nalgorithm: FIXED_WINDOW\nlimit: %d\nperiod: 1s\n", i, 100+i)
		if _, err := b.put("seed", def, 0); err != nil {
			panic(err)
		}
	}
}

// advance moves the clock one second and adds a point to rule's series.
func (b *fakeBackend) advance(rule string, admitted, denied int64) {
	b.clock.Advance(time.Second)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.series[rule] = append(b.series[rule], Point{Time: b.clock.Now().Add(-time.Second), Admitted: admitted, Denied: denied,
		Permits: admitted, Utilisation: float64(admitted) / 100})
}

func (b *fakeBackend) lastCred() Credential {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.creds[len(b.creds)-1]
}

func (b *fakeBackend) revoke(token string) {
	b.mu.Lock()
	delete(b.tokens, token)
	b.mu.Unlock()
}

func (b *fakeBackend) whoLocked(c Credential) (Principal, error) {
	b.creds = append(b.creds, c)
	if c.Token != "" {
		if p, ok := b.tokens[c.Token]; ok {
			return p, nil
		}
		return Principal{}, status.Error(codes.Unauthenticated, "unknown bearer token")
	}
	if c.TLS != nil && len(c.TLS.PeerCertificates) > 0 {
		if p, ok := b.certs[c.TLS.PeerCertificates[0].Subject.CommonName]; ok {
			return p, nil
		}
		return Principal{}, status.Error(codes.Unauthenticated, "unknown client certificate")
	}
	if host, _, err := net.SplitHostPort(c.RemoteAddr); err == nil && b.loopbackOpen && net.ParseIP(host).IsLoopback() {
		return Principal{Roles: []string{"admin"}}, nil
	}
	return Principal{}, status.Error(codes.Unauthenticated, "no credential")
}

// authorize checks c holds role, as the node's interceptor does.
func (b *fakeBackend) authorize(c Credential, role string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	p, err := b.whoLocked(c)
	if err != nil {
		return err
	}
	implied := map[string][]string{"admin": {"admin", "editor", "viewer"}, "editor": {"editor", "viewer"}, "viewer": {"viewer"}}
	for _, r := range p.Roles {
		if slices.Contains(implied[r], role) {
			return nil
		}
	}
	return status.Errorf(codes.PermissionDenied, "%q lacks the %s role", p.Name, role)
}

func (b *fakeBackend) WhoAmI(_ context.Context, c Credential) (Principal, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.whoLocked(c)
}

func (b *fakeBackend) ClusterStatus(_ context.Context, c Credential) (Cluster, error) {
	if err := b.authorize(c, "viewer"); err != nil {
		return Cluster{}, err
	}
	ms := make([]Member, 3)
	for i := range ms {
		ms[i] = Member{ID: fmt.Sprintf("node-%d", i+1), Address: fmt.Sprintf("10.0.0.%d:7070", i+1), Leader: i == 0, Voter: true,
			Ready: true, Live: true, Health: "SERVING", Epoch: 7, BucketBytes: int64(i+1) << 20, BucketBudget: 256 << 20,
			DecisionsPerSecond: float64(1000 * (i + 1))}
	}
	return Cluster{Members: ms, Epoch: 7}, nil
}

func (b *fakeBackend) ListRules(_ context.Context, c Credential) ([]RuleSummary, error) {
	if err := b.authorize(c, "viewer"); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]RuleSummary, 0, len(b.rules))
	for i, name := range sortedKeys(b.rules) {
		r := b.rules[name]
		spark := make([]float64, 60)
		for j := range spark {
			spark[j] = float64((i*7 + j*13) % 50)
		}
		out = append(out, RuleSummary{Name: name, Algorithm: "TOKEN_BUCKET", Limit: 100, Period: time.Second, Version: r.Version,
			DecisionsPerSecond: float64(i%90) * 1.5, DeniedRatio: float64(i%10) / 100, Utilisation: float64(i%100) / 100, Sparkline: spark,
			Durable: r.Cost.Durable, Bound: int64(i * 11)})
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func (b *fakeBackend) GetRule(_ context.Context, c Credential, name string) (Rule, error) {
	if err := b.authorize(c, "viewer"); err != nil {
		return Rule{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.rules[name]
	if !ok {
		return Rule{}, status.Errorf(codes.NotFound, "rule %q not found", name)
	}
	return r, nil
}

func (b *fakeBackend) RuleSeries(_ context.Context, c Credential, name string, from, to time.Time) ([]Point, error) {
	if err := b.authorize(c, "viewer"); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Point
	for _, p := range b.series[name] {
		if !p.Time.Before(from) && p.Time.Before(to) {
			out = append(out, p)
		}
	}
	return out, nil
}

func (b *fakeBackend) TopKeys(_ context.Context, c Credential, rule string, n int, _ time.Duration, denied bool) ([]TopKey, error) {
	if err := b.authorize(c, "viewer"); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	k := rule
	if denied {
		k += "/denied"
	}
	ks := b.top[k]
	return ks[:min(n, len(ks))], nil
}

func (b *fakeBackend) RuleHistory(_ context.Context, c Credential, name string) ([]RuleVersion, error) {
	if err := b.authorize(c, "viewer"); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.history[name]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "rule %q not found", name)
	}
	return slices.Clone(h), nil
}

// fakeRuleDoc is the part of a rule the fake validates.
type fakeRuleDoc struct {
	Name      string `yaml:"name"`
	Algorithm string `yaml:"algorithm"`
	Limit     int64  `yaml:"limit"`
	Period    string `yaml:"period"`
}

func (b *fakeBackend) put(principal, def string, expected uint64) (Rule, error) {
	var d fakeRuleDoc
	if err := yaml.Unmarshal([]byte(def), &d); err != nil {
		return Rule{}, status.Errorf(codes.InvalidArgument, "rule: %v", err)
	}
	switch {
	case d.Name == "":
		return Rule{}, status.Error(codes.InvalidArgument, "rule: name is required")
	case d.Limit <= 0:
		return Rule{}, status.Errorf(codes.InvalidArgument, "rule %q: limit must be > 0 (got %d) <at line 3>", d.Name, d.Limit)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, exists := b.rules[d.Name]
	if expected != 0 && (!exists || cur.Version != expected) {
		return Rule{}, status.Errorf(codes.FailedPrecondition, "rule %q is at version %d, not %d", d.Name, cur.Version, expected)
	}
	b.index++
	r := Rule{Name: d.Name, Version: b.index, Definition: def}
	b.rules[d.Name] = r
	change := "update"
	if !exists {
		change = "create"
	}
	b.history[d.Name] = append([]RuleVersion{{Version: r.Version, Principal: principal, Time: b.clock.Now(), Change: change, Definition: def}}, b.history[d.Name]...)
	return r, nil
}

func (b *fakeBackend) PutRule(_ context.Context, c Credential, def string, expected uint64) (Rule, error) {
	if err := b.authorize(c, "editor"); err != nil {
		return Rule{}, err
	}
	p, _ := b.WhoAmI(context.Background(), c)
	return b.put(p.Name, def, expected)
}

func (b *fakeBackend) RollbackRule(_ context.Context, c Credential, name string, to uint64) (uint64, error) {
	if err := b.authorize(c, "editor"); err != nil {
		return 0, err
	}
	p, _ := b.WhoAmI(context.Background(), c)
	b.mu.Lock()
	v, ok := findVersion(b.history[name], to)
	b.mu.Unlock()
	if !ok {
		return 0, status.Errorf(codes.NotFound, "rule %q has no version %d", name, to)
	}
	r, err := b.put(p.Name, v.Definition, 0)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	b.history[name][0].Change = fmt.Sprintf("rollback to %d", to)
	b.mu.Unlock()
	return r.Version, nil
}

// fakeFullBackend also supports the optional pages.
type fakeFullBackend struct{ *fakeBackend }

func (b fakeFullBackend) ListOverrides(_ context.Context, c Credential, rule string) ([]Override, error) {
	if err := b.authorize(c, "viewer"); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.initOverrides()
	return slices.Clone(b.overrides), nil
}

func (b fakeFullBackend) initOverrides() {
	if b.overrides == nil {
		b.overrides = []Override{{Rule: "api", Key: "vip-*", Limit: 1000, Period: time.Second}}
	}
}

// PutOverride validates as the node does (a known rule, a positive
// limit) and stores the override.
func (b fakeFullBackend) PutOverride(_ context.Context, c Credential, o Override) (Override, error) {
	if err := b.authorize(c, "editor"); err != nil {
		return Override{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.initOverrides()
	_, ok := b.rules[o.Rule]
	switch {
	case !ok:
		return Override{}, status.Errorf(codes.NotFound, "rule %q not found", o.Rule)
	case o.Limit <= 0:
		return Override{}, status.Errorf(codes.InvalidArgument, "override limit must be positive, got %d", o.Limit)
	}
	b.index++
	o.Version, o.Period = b.index, time.Second
	b.overrides = slices.DeleteFunc(b.overrides, func(x Override) bool { return x.Rule == o.Rule && x.Key == o.Key })
	b.overrides = append(b.overrides, o)
	return o, nil
}

func (b fakeFullBackend) DeleteOverride(_ context.Context, c Credential, rule, key string) error {
	if err := b.authorize(c, "editor"); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.initOverrides()
	b.overrides = slices.DeleteFunc(b.overrides, func(x Override) bool { return x.Rule == rule && x.Key == key })
	return nil
}

func (b fakeFullBackend) ListEnvoyDomains(_ context.Context, c Credential) ([]EnvoyDomain, error) {
	if err := b.authorize(c, "viewer"); err != nil {
		return nil, err
	}
	return []EnvoyDomain{{Domain: "edge", Version: 3, Descriptors: 2, Definition: "domain: edge\n",
		History: []EnvoyVersion{{Version: 3, Principal: "file:edge.yaml", Change: "SYNC", Time: b.clock.Now()}, {Version: 1, Principal: "alice", Change: "PUT"}}}}, nil
}

// RuleBound gives every member a bound for rule api (durable, with a
// checkpoint on m1) and nothing for the others.
func (b fakeFullBackend) RuleBound(_ context.Context, c Credential, rule string) (RuleBound, error) {
	if err := b.authorize(c, "viewer"); err != nil {
		return RuleBound{}, err
	}
	b.mu.Lock()
	r, ok := b.rules[rule]
	b.mu.Unlock()
	if !ok {
		return RuleBound{}, status.Errorf(codes.NotFound, "rule %q not found", rule)
	}
	out := RuleBound{Durable: r.Cost.Durable, Missing: []string{"m3"}}
	for i, id := range []string{"m1", "m2"} {
		nb := NodeBound{Node: id, Parts: []BoundPart{{"unplanned_fresh", 0}, {"leases", 0}, {"debt", 0}, {"replication_lag", 0}}}
		if rule == "api" {
			nb.Parts[0].Permits, nb.Parts[3].Permits = int64(100*(i+1)), int64(7*(i+1))
			nb.Permits = nb.Parts[0].Permits + nb.Parts[3].Permits
		}
		if i == 0 {
			nb.Checkpoint, nb.CheckpointBuckets = b.clock.Now(), 42
		}
		out.Nodes = append(out.Nodes, nb)
	}
	return out, nil
}

// PutRuleCost validates as the node does (a known time zone, a
// non-negative TTL) and stores the fields under expected.
func (b fakeFullBackend) PutRuleCost(_ context.Context, c Credential, name string, cost Cost, expected uint64) (Rule, error) {
	if err := b.authorize(c, "editor"); err != nil {
		return Rule{}, err
	}
	if _, err := time.LoadLocation(cost.TimeZone); err != nil {
		return Rule{}, status.Errorf(codes.InvalidArgument, "rule %q: time_zone %q: unknown time zone", name, cost.TimeZone)
	}
	if cost.ReservationTTL < 0 {
		return Rule{}, status.Errorf(codes.InvalidArgument, "rule %q: reservation_ttl must be >= 0", name)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.rules[name]
	switch {
	case !ok:
		return Rule{}, status.Errorf(codes.NotFound, "rule %q not found", name)
	case expected != 0 && r.Version != expected:
		return Rule{}, status.Errorf(codes.FailedPrecondition, "rule %q is at version %d, not %d", name, r.Version, expected)
	}
	b.index++
	r.Version, r.Cost = b.index, cost
	b.rules[name] = r
	b.history[name] = append([]RuleVersion{{Version: r.Version, Principal: "editor", Time: b.clock.Now(), Change: "update", Definition: r.Definition}}, b.history[name]...)
	return r, nil
}
