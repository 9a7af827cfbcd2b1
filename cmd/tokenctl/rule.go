package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func newRuleCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rule",
		Short: "Create, apply, read and delete rules",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	cmd.AddCommand(newRulePutCmd(a), newRuleApplyCmd(a), newRuleGetCmd(a), newRuleListCmd(a), newRuleDeleteCmd(a))
	cmd.AddCommand(newRuleHistoryCmds(a)...)
	return cmd
}

// putFlags are the flags of rule put.
type putFlags struct {
	algorithm       string
	limit           int64
	period          time.Duration
	burst           int64
	sampleCount     int32
	warmup          time.Duration
	penalty         time.Duration
	maxKeys         int64
	overrides       []string
	deny            []string
	allow           []string
	shadow          bool
	durable         bool
	fallback        string
	fallbackLimit   int64
	leaseMax        int64
	leaseTTL        time.Duration
	expectedVersion uint64
	inlineMaxLimit  int64
	inlineMaxPeriod time.Duration
	calendar        string
	timeZone        string
	reservationTTL  time.Duration
}

func newRulePutCmd(a *app) *cobra.Command {
	var f putFlags
	cmd := &cobra.Command{
		Use:   "put NAME --algorithm ALG --limit N --period D [flags]",
		Short: "Create or replace a rule",
		Long: `Create or replace the rule NAME and print it as stored.

--limit permits per --period; for a concurrency rule --limit is the number of
leases held at once and --period their lifetime. --burst defaults to the limit.

A fixed-window rule with --calendar day|week|month counts per local calendar
day, ISO week or month in --time-zone (default UTC); --period is then not
needed. --inline-max-limit lets requests carry their own limit, up to that
limit (and --inline-max-period). --reservation-ttl is how long a reservation
may be committed (default: the rule's window).`,
		Example: `  tokenctl rule put api --algorithm token-bucket --limit 100 --period 1s --burst 200
  tokenctl rule put login --algorithm sliding-log --limit 5 --period 1m --penalty 5m --deny bad-ip
  tokenctl rule put jobs --algorithm concurrency --limit 10 --period 30s
  tokenctl rule put api --algorithm token-bucket --limit 100 --period 1s --override vip=1000/2000
  tokenctl rule put llm-monthly --algorithm fixed-window --limit 1000000 --calendar month --time-zone Europe/Berlin
  tokenctl rule put llm --algorithm token-bucket --limit 1000 --period 1m --inline-max-limit 100000 --inline-max-period 1h --reservation-ttl 30s`,
		Args: argNames("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := f.rule(cmd, args[0])
			if err != nil {
				return err
			}
			req := &pb.PutRuleRequest{Rule: r, RequestId: newRequestID()}
			if cmd.Flags().Changed("expected-version") {
				req.ExpectedVersion = &f.expectedVersion
			}
			resp, err := adminRPC(a, cmd, fmt.Sprintf("put rule %q", r.GetName()), func(ctx context.Context, c pb.AdminServiceClient) (*pb.PutRuleResponse, error) {
				return c.PutRule(ctx, req)
			})
			if err != nil {
				return err
			}
			return a.writeRule(resp.GetRule())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.algorithm, "algorithm", "", "token-bucket, leaky-bucket, fixed-window, sliding-window, sliding-log or concurrency (required)")
	fl.Int64Var(&f.limit, "limit", 0, "permits per period; for concurrency, leases at once (required)")
	fl.DurationVar(&f.period, "period", 0, "the limit's period; for concurrency, a lease's lifetime (required)")
	fl.Int64Var(&f.burst, "burst", 0, "capacity of a token or leaky bucket (default: the limit)")
	fl.Int32Var(&f.sampleCount, "sample-count", 0, "sliding-window sub-windows per period; must divide it (default 10)")
	fl.DurationVar(&f.warmup, "warmup", 0, "token-bucket warm-up: a cold key ramps from a third of the rate to full over this time")
	fl.DurationVar(&f.penalty, "penalty", 0, "lock a key out for this long after its first denial")
	fl.Int64Var(&f.maxKeys, "max-keys", 0, "most keys the rule holds per node (0: no cap; sliding-log: 10000)")
	fl.StringArrayVar(&f.overrides, "override", nil, "KEY=LIMIT[/BURST]: a key with its own limit (repeatable)")
	fl.StringArrayVar(&f.deny, "deny", nil, "a key that is always denied (repeatable)")
	fl.StringArrayVar(&f.allow, "allow", nil, "a key that is always allowed (repeatable)")
	fl.BoolVar(&f.shadow, "shadow", false, "decide and count, but always allow")
	fl.BoolVar(&f.durable, "durable", false, "replicate buckets to the next owner and checkpoint them (periods of 1h or more)")
	fl.StringVar(&f.fallback, "fallback", "", "what clients do when the server is unreachable: local, allow or deny")
	fl.Int64Var(&f.fallbackLimit, "fallback-limit", 0, "with --fallback local: permits per period each client instance admits on its own")
	fl.Int64Var(&f.leaseMax, "lease-max", 0, "most tokens one client lease may take (0: no leasing)")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", 0, "longest a client may hold leased tokens")
	fl.Uint64Var(&f.expectedVersion, "expected-version", 0, "compare-and-set: the version the rule must have (0: it must not exist)")
	fl.Int64Var(&f.inlineMaxLimit, "inline-max-limit", 0, "let requests carry their own limit, at most this (0: requests may not)")
	fl.DurationVar(&f.inlineMaxPeriod, "inline-max-period", 0, "with --inline-max-limit: the longest period a request may carry")
	fl.StringVar(&f.calendar, "calendar", "", "fixed-window only: windows of local calendar days, ISO weeks or months: day, week or month (--period then not needed)")
	fl.StringVar(&f.timeZone, "time-zone", "", "with --calendar: the IANA time zone of the windows (default UTC)")
	fl.DurationVar(&f.reservationTTL, "reservation-ttl", 0, "how long a reservation may be committed before it is settled at its estimate (default: the rule's window)")
	return cmd
}

// rule builds the rule the flags describe. Syntax is checked here; the
// server validates the values.
func (f *putFlags) rule(cmd *cobra.Command, name string) (*pb.Rule, error) {
	required := []string{"algorithm", "limit", "period"}
	if cmd.Flags().Changed("calendar") {
		required = required[:2] // a calendar window needs no period
	}
	if err := requireFlags(cmd, required...); err != nil {
		return nil, err
	}
	alg, err := parseAlgorithm(f.algorithm)
	if err != nil {
		return nil, usagef("--algorithm: %v", err)
	}
	r := &pb.Rule{
		Name:        name,
		Algorithm:   alg,
		Limit:       f.limit,
		Period:      durationpb.New(f.period),
		Burst:       f.burst,
		SampleCount: f.sampleCount,
		MaxKeys:     f.maxKeys,
		Deny:        f.deny,
		Allow:       f.allow,
		Shadow:      f.shadow,
		Durable:     f.durable,
	}
	if cmd.Flags().Changed("warmup") {
		r.Warmup = durationpb.New(f.warmup)
	}
	if cmd.Flags().Changed("penalty") {
		r.Penalty = durationpb.New(f.penalty)
	}
	for _, s := range f.overrides {
		o, err := parseOverride(s)
		if err != nil {
			return nil, usagef("--override %q: %v", s, err)
		}
		r.Overrides = append(r.Overrides, o)
	}
	if cmd.Flags().Changed("fallback") || cmd.Flags().Changed("fallback-limit") {
		r.Fallback = &pb.Fallback{Limit: f.fallbackLimit}
		if cmd.Flags().Changed("fallback") {
			if r.Fallback.Policy, err = parseFallback(f.fallback); err != nil {
				return nil, usagef("--fallback: %v", err)
			}
		} else {
			return nil, usagef("--fallback-limit needs --fallback local")
		}
	}
	if cmd.Flags().Changed("lease-max") || cmd.Flags().Changed("lease-ttl") {
		r.Lease = &pb.LeaseSettings{MaxBatch: f.leaseMax, Ttl: durationpb.New(f.leaseTTL)}
	}
	if !cmd.Flags().Changed("period") {
		r.Period = nil
	}
	if err := f.costFields(cmd, r); err != nil {
		return nil, err
	}
	return r, nil
}

// costFields sets the calendar, inline, reservation and durable fields
// the flags give. Syntax and local facts (a time zone this machine knows)
// are checked here, each error naming its flag; the server validates the
// rest.
func (f *putFlags) costFields(cmd *cobra.Command, r *pb.Rule) error {
	changed := cmd.Flags().Changed
	if changed("calendar") {
		c, err := parseCalendar(f.calendar)
		if err != nil {
			return usagef("--calendar: %v", err)
		}
		r.Calendar = c
	}
	if changed("time-zone") {
		if !changed("calendar") {
			return usagef("--time-zone needs --calendar")
		}
		if f.timeZone == "" {
			return usagef("--time-zone: empty (leave the flag out for UTC)")
		}
		if _, err := time.LoadLocation(f.timeZone); err != nil {
			return usagef("--time-zone: %q is not an IANA time zone: %v", f.timeZone, err)
		}
		r.TimeZone = f.timeZone
	}
	if changed("inline-max-limit") || changed("inline-max-period") {
		switch {
		case !changed("inline-max-limit"):
			return usagef("--inline-max-period needs --inline-max-limit")
		case f.inlineMaxLimit <= 0:
			return usagef("--inline-max-limit: must be > 0, got %d", f.inlineMaxLimit)
		case f.inlineMaxPeriod < 0:
			return usagef("--inline-max-period: must be >= 0, got %v", f.inlineMaxPeriod)
		}
		r.Inline = &pb.InlinePolicy{MaxLimit: f.inlineMaxLimit}
		if changed("inline-max-period") {
			r.Inline.MaxPeriod = durationpb.New(f.inlineMaxPeriod)
		}
	}
	if changed("reservation-ttl") {
		if f.reservationTTL <= 0 {
			return usagef("--reservation-ttl: must be > 0, got %v", f.reservationTTL)
		}
		r.ReservationTtl = durationpb.New(f.reservationTTL)
	}
	r.Durable = f.durable
	return nil
}

// calendarNames spells the calendars as flags do.
var calendarNames = map[pb.Calendar]string{
	pb.Calendar_DAY:   "day",
	pb.Calendar_WEEK:  "week",
	pb.Calendar_MONTH: "month",
}

// parseCalendar reads day, week or month (any case).
func parseCalendar(s string) (pb.Calendar, error) {
	norm := strings.ToLower(s)
	for c, n := range calendarNames {
		if n == norm {
			return c, nil
		}
	}
	return 0, fmt.Errorf("unknown calendar %q (want day, week or month)", s)
}

// parseOverride reads KEY=LIMIT or KEY=LIMIT/BURST. The key is everything
// before the last '=', so a key may itself hold '='.
func parseOverride(s string) (*pb.Override, error) {
	i := strings.LastIndexByte(s, '=')
	if i < 0 {
		return nil, fmt.Errorf("want KEY=LIMIT[/BURST], found no '='")
	}
	key, val := s[:i], s[i+1:]
	if key == "" {
		return nil, fmt.Errorf("want KEY=LIMIT[/BURST], the key is empty")
	}
	limStr, burstStr, hasBurst := strings.Cut(val, "/")
	lim, err := strconv.ParseInt(limStr, 10, 64)
	if err != nil || lim <= 0 {
		return nil, fmt.Errorf("want KEY=LIMIT[/BURST], LIMIT %q is not an integer > 0", limStr)
	}
	o := &pb.Override{Key: key, Limit: lim}
	if hasBurst {
		b, err := strconv.ParseInt(burstStr, 10, 64)
		if err != nil || b <= 0 {
			return nil, fmt.Errorf("want KEY=LIMIT[/BURST], BURST %q is not an integer > 0", burstStr)
		}
		o.Burst = b
	}
	return o, nil
}

// writeRule prints one rule in the chosen format.
func (a *app) writeRule(r *pb.Rule) error {
	if a.structured() {
		return a.write(r)
	}
	return writeRuleTable(a.stdout, r)
}

func newRuleGetCmd(a *app) *cobra.Command {
	var local bool
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Print one rule",
		Args:  argNames("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := adminRPC(a, cmd, fmt.Sprintf("get rule %q", args[0]), func(ctx context.Context, c pb.AdminServiceClient) (*pb.Rule, error) {
				return c.GetRule(ctx, &pb.GetRuleRequest{Name: args[0], Local: local})
			})
			if err != nil {
				return err
			}
			return a.writeRule(r)
		},
	}
	cmd.Flags().BoolVar(&local, "local", false, "read the answering node's own copy instead of the leader's")
	return cmd
}

func newRuleListCmd(a *app) *cobra.Command {
	var local bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List every rule, sorted by name",
		Long:  "List every rule, sorted by name. With -o json or -o yaml: an object whose \"rules\" is the list, which 'rule apply -f' reads back.",
		Args:  argNames(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			rules, err := listRules(a, cmd, local)
			if err != nil {
				return err
			}
			if a.structured() {
				return a.writeRules(rules)
			}
			if len(rules) == 0 {
				a.logf("no rules")
				return nil
			}
			return writeRulesTable(a.stdout, rules)
		},
	}
	cmd.Flags().BoolVar(&local, "local", false, "read the answering node's own copy instead of the leader's")
	return cmd
}

// listRules reads every rule, following the pages; each page is its own
// call (with its own retries), and a page token that repeats ends the loop.
func listRules(a *app, cmd *cobra.Command, local bool) ([]*pb.Rule, error) {
	var rules []*pb.Rule
	token := ""
	for page := 1; ; page++ {
		resp, err := adminRPC(a, cmd, fmt.Sprintf("list rules (page %d)", page), func(ctx context.Context, c pb.AdminServiceClient) (*pb.ListRulesResponse, error) {
			return c.ListRules(ctx, &pb.ListRulesRequest{Local: local, PageToken: token})
		})
		if err != nil {
			return nil, err
		}
		rules = append(rules, resp.GetRules()...)
		next := resp.GetNextPageToken()
		if next == "" || next == token {
			return rules, nil
		}
		token = next
	}
}

func newRuleDeleteCmd(a *app) *cobra.Command {
	var expected uint64
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a rule and drop its buckets",
		Args:  argNames("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &pb.DeleteRuleRequest{Name: args[0], RequestId: newRequestID()}
			if cmd.Flags().Changed("expected-version") {
				req.ExpectedVersion = &expected
			}
			_, err := adminRPC(a, cmd, fmt.Sprintf("delete rule %q", args[0]), func(ctx context.Context, c pb.AdminServiceClient) (*pb.DeleteRuleResponse, error) {
				return c.DeleteRule(ctx, req)
			})
			if err != nil {
				return err
			}
			if a.structured() {
				return a.write(map[string]string{"deleted": args[0]})
			}
			_, err = fmt.Fprintf(a.stdout, "deleted rule %s\n", args[0])
			return err
		},
	}
	cmd.Flags().Uint64Var(&expected, "expected-version", 0, "compare-and-set: the version the rule must have")
	return cmd
}
