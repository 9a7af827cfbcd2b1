package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// acquireResult is what acquire prints.
type acquireResult struct {
	Rule         string `json:"rule"`
	Key          string `json:"key"`
	Calls        int64  `json:"calls"`
	Allowed      int64  `json:"allowed"`
	Denied       int64  `json:"denied"`
	ShadowDenied int64  `json:"shadowDenied"`
	Granted      int64  `json:"granted"`
	Remaining    int64  `json:"remaining"`
	RetryAfter   string `json:"retryAfter"`
	RetryAfterNs int64  `json:"retryAfterNs"`
	ResetAfterNs int64  `json:"resetAfterNs"`
	WaitBeforeNs int64  `json:"waitBeforeNs"`
	LastGrantID  string `json:"lastGrantId"`
	LastReason   string `json:"lastReason"`
	RuleVersion  uint64 `json:"ruleVersion"`
	Epoch        uint64 `json:"epoch"`
	ElapsedNs    int64  `json:"elapsedNs"`
}

func newAcquireCmd(a *app) *cobra.Command {
	var (
		permits  int64
		partial  bool
		maxWait  time.Duration
		count    int64
		duration time.Duration
		inline   inlineFlags
	)
	cmd := &cobra.Command{
		Use:   "acquire RULE KEY",
		Short: "Acquire tokens by hand",
		Long: `Acquire --permits tokens of KEY under RULE, --count times in a row (default
once) or as many times as fit in --duration, each with its own AcquireToken
call. tokenctl keeps the grants it gets and gives none back (see refill).

It prints how many calls were allowed and denied, the tokens granted, and the
remaining tokens, retry-after and grant id of the last call. A denial is a
result: the exit code is 0. With --duration the deadline is --duration plus
--timeout.`,
		Example: `  tokenctl acquire api alice
  tokenctl acquire api alice --count 5 -o json
  tokenctl acquire api alice --permits 10 --partial
  tokenctl acquire api alice --duration 2s
  tokenctl acquire llm tenant-a --permits 500 --limit 2000 --limit-period 1h`,
		Args: argNames("RULE", "KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("count") && cmd.Flags().Changed("duration") {
				return usagef("--count and --duration exclude each other")
			}
			if count < 1 {
				return usagef("--count must be >= 1, got %d", count)
			}
			if cmd.Flags().Changed("duration") && duration <= 0 {
				return usagef("--duration must be > 0, got %v", duration)
			}
			if maxWait < 0 {
				return usagef("--max-wait must be >= 0, got %v", maxWait)
			}
			limit, err := inline.request(cmd)
			if err != nil {
				return err
			}
			tc, _, done, err := a.clients()
			if err != nil {
				return err
			}
			defer done()
			extra := time.Duration(0)
			if duration > 0 {
				extra = duration
			}
			ctx, cancel := a.context(cmd, extra)
			defer cancel()
			req := &pb.AcquireTokenRequest{Rule: args[0], Key: args[1], Partial: partial, MaxWaitNs: int64(maxWait), Limit: limit}
			if cmd.Flags().Changed("permits") {
				req.Permits = &permits
			}
			res := acquireResult{Rule: args[0], Key: args[1]}
			start := time.Now()
			what := fmt.Sprintf("acquire %q of rule %q", args[1], args[0])
			for i := int64(0); ; i++ {
				if duration > 0 {
					if time.Since(start) >= duration {
						break
					}
				} else if i >= count {
					break
				}
				var resp *pb.AcquireTokenResponse
				err := a.call(ctx, what, func(ctx context.Context) (err error) {
					resp, err = tc.AcquireToken(ctx, req)
					return err
				})
				if err != nil {
					if res.Calls > 0 {
						a.logf("%d calls made before the error: %d allowed, %d denied", res.Calls, res.Allowed, res.Denied)
					}
					return err
				}
				res.add(resp)
			}
			res.ElapsedNs = int64(time.Since(start))
			if a.structured() {
				return a.write(res)
			}
			return res.writeTable(a.stdout)
		},
	}
	fl := cmd.Flags()
	fl.Int64Var(&permits, "permits", 1, "tokens per call; 0 peeks without taking any")
	fl.BoolVar(&partial, "partial", false, "accept fewer tokens than --permits (token bucket and windows)")
	fl.DurationVar(&maxWait, "max-wait", 0, "shaping: wait up to this long for the tokens instead of being denied (token and leaky bucket)")
	fl.Int64Var(&count, "count", 1, "calls to make in a row")
	fl.DurationVar(&duration, "duration", 0, "make calls for this long instead of --count times")
	inline.register(fl)
	return cmd
}

// add counts one answer.
func (r *acquireResult) add(resp *pb.AcquireTokenResponse) {
	r.Calls++
	if resp.GetAllowed() {
		r.Allowed++
	} else {
		r.Denied++
	}
	if resp.GetShadowDenied() {
		r.ShadowDenied++
	}
	r.Granted += resp.GetGranted()
	r.Remaining = resp.GetRemaining()
	r.RetryAfterNs = resp.GetRetryAfterNs()
	r.RetryAfter = fmtNs(resp.GetRetryAfterNs())
	r.ResetAfterNs = resp.GetResetAfterNs()
	r.WaitBeforeNs = resp.GetWaitBeforeNs()
	if id := resp.GetGrantId(); id != "" {
		r.LastGrantID = id
	}
	r.LastReason = resp.GetReason().String()
	r.RuleVersion = resp.GetRuleVersion()
	r.Epoch = resp.GetEpoch()
}

func (r *acquireResult) writeTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, args ...any) {
		fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{k}, args...)...)
	}
	row("rule", "%s (version %d)", r.Rule, r.RuleVersion)
	row("key", "%s", r.Key)
	row("calls", "%d in %v", r.Calls, time.Duration(r.ElapsedNs).Round(time.Microsecond))
	row("allowed", "%d", r.Allowed)
	row("denied", "%d", r.Denied)
	if r.ShadowDenied > 0 {
		row("shadow denied", "%d (allowed by the shadow rule)", r.ShadowDenied)
	}
	row("granted", "%d", r.Granted)
	row("remaining", "%d", r.Remaining)
	row("retry after", "%s", r.RetryAfter)
	row("reset after", "%s", fmtNs(r.ResetAfterNs))
	if r.WaitBeforeNs > 0 {
		row("wait before", "%s", fmtNs(r.WaitBeforeNs))
	}
	row("last reason", "%s", r.LastReason)
	id := r.LastGrantID
	if id == "" {
		id = "-"
	}
	row("last grant id", "%s", id)
	return tw.Flush()
}

func newRefillCmd(a *app) *cobra.Command {
	var (
		grant   string
		permits int64
	)
	cmd := &cobra.Command{
		Use:   "refill RULE KEY --grant ID",
		Short: "Give back unused tokens of a grant, or end a concurrency lease",
		Long: `Give back --permits unused tokens of the grant --grant (all of them by
default), or end a concurrency lease. The server clamps what goes back: never
more than the grant took nor above capacity, and nothing once the grant's
window or lease has passed. A grant is refilled at most once.

When fewer tokens go back than asked, "why" says what that can mean (the
server does not name the cause).`,
		Example: `  tokenctl refill api alice --grant Al8cCpOyfk0WOpwOL3G4TQUAAAAAAAAAAcR9IemgO29Y
  tokenctl refill api alice --grant Al8cCpOyfk0WOpwOL3G4TQUAAAAAAAAAAcR9IemgO29Y --permits 2`,
		Args: argNames("RULE", "KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireFlags(cmd, "grant"); err != nil {
				return err
			}
			if grant == "" {
				return usagef("--grant is empty")
			}
			req := &pb.RefillTokenRequest{Rule: args[0], Key: args[1], GrantId: grant}
			if cmd.Flags().Changed("permits") {
				req.Permits = &permits
			}
			tc, _, done, err := a.clients()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := a.context(cmd, 0)
			defer cancel()
			var resp *pb.RefillTokenResponse
			err = a.call(ctx, fmt.Sprintf("refill %q of rule %q", args[1], args[0]), func(ctx context.Context) (err error) {
				resp, err = tc.RefillToken(ctx, req)
				return err
			})
			if err != nil {
				return err
			}
			res := refillResult{Rule: args[0], Key: args[1], GrantID: grant, Refilled: resp.GetRefilled(),
				Remaining: resp.GetRemaining(), RuleVersion: resp.GetRuleVersion()}
			res.Reason = refillReason(resp.GetRefilled(), req.Permits)
			if a.structured() {
				return a.write(res)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "refilled:\t%d\nremaining:\t%d\n", res.Refilled, res.Remaining)
			if res.Reason != "" {
				fmt.Fprintf(tw, "why:\t%s\n", res.Reason)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&grant, "grant", "", "the grant id that acquire printed (required)")
	cmd.Flags().Int64Var(&permits, "permits", 0, "tokens to give back (default: all the grant took)")
	return cmd
}

// refillResult is what refill prints.
type refillResult struct {
	Rule        string `json:"rule"`
	Key         string `json:"key"`
	GrantID     string `json:"grantId"`
	Refilled    int64  `json:"refilled"`
	Remaining   int64  `json:"remaining"`
	RuleVersion uint64 `json:"ruleVersion"`
	// Reason says why fewer tokens than asked went back; empty when all
	// did.
	Reason string `json:"reason"`
}

// refillReason explains a refill that gave back fewer tokens than asked
// (asked nil: all the grant took). RefillTokenResponse carries no reason,
// so a 0 lists what the server's rules allow it to mean.
func refillReason(refilled int64, asked *int64) string {
	switch {
	case refilled == 0:
		return "nothing went back: the grant was already refilled (a grant is refilled at most once), " +
			"the grant id is unknown to this rule and key, the grant's window or lease has passed, " +
			"or the bucket was already full (a refill is clamped to capacity); the server does not say which"
	case asked != nil && refilled < *asked:
		return fmt.Sprintf("clamped from %d: never more than the grant took nor above the bucket's capacity", *asked)
	}
	return ""
}

func newLeaseCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lease",
		Short: "Concurrency leases",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	var grant string
	renew := &cobra.Command{
		Use:     "renew RULE KEY --grant ID",
		Short:   "Extend a concurrency lease by the rule's period",
		Example: `  tokenctl lease renew jobs worker-1 --grant Al8cCpOyfk0WOpwOL3G4TQUAAAAAAAAAAcR9IemgO29Y`,
		Args:    argNames("RULE", "KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireFlags(cmd, "grant"); err != nil {
				return err
			}
			tc, _, done, err := a.clients()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := a.context(cmd, 0)
			defer cancel()
			var resp *pb.RenewLeaseResponse
			err = a.call(ctx, fmt.Sprintf("renew lease of %q under rule %q", args[1], args[0]), func(ctx context.Context) (err error) {
				resp, err = tc.RenewLease(ctx, &pb.RenewLeaseRequest{Rule: args[0], Key: args[1], GrantId: grant})
				return err
			})
			if err != nil {
				return err
			}
			if a.structured() {
				return a.write(resp)
			}
			if !resp.GetRenewed() {
				_, err = fmt.Fprintln(a.stdout, "renewed: false (the lease had expired or was released)")
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "renewed: true, expires after %s\n", fmtNs(resp.GetExpiresAfterNs()))
			return err
		},
	}
	renew.Flags().StringVar(&grant, "grant", "", "the lease's grant id (required)")
	cmd.AddCommand(renew)
	return cmd
}
