package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// inlineFlags are acquire's flags for a limit carried in the request
// (AcquireTokenRequest.limit), allowed by the rule's inline policy.
type inlineFlags struct {
	limit  int64
	period time.Duration
	burst  int64
}

func (f *inlineFlags) register(fl *pflag.FlagSet) {
	fl.Int64Var(&f.limit, "limit", 0, "carry this limit in the request (the rule must allow it: rule put --inline-max-limit)")
	fl.DurationVar(&f.period, "limit-period", 0, "with --limit: its period (default: the rule's)")
	fl.Int64Var(&f.burst, "limit-burst", 0, "with --limit: its burst (default: the limit)")
}

// request is the InlineLimit the flags ask for, nil without --limit.
func (f *inlineFlags) request(cmd *cobra.Command) (*pb.InlineLimit, error) {
	fl := cmd.Flags()
	if !fl.Changed("limit") {
		for _, name := range []string{"limit-period", "limit-burst"} {
			if fl.Changed(name) {
				return nil, usagef("--%s needs --limit", name)
			}
		}
		return nil, nil
	}
	switch {
	case f.limit <= 0:
		return nil, usagef("--limit must be > 0, got %d", f.limit)
	case f.period < 0:
		return nil, usagef("--limit-period must be >= 0, got %v", f.period)
	case f.burst < 0:
		return nil, usagef("--limit-burst must be >= 0, got %d", f.burst)
	}
	return &pb.InlineLimit{Limit: f.limit, PeriodNs: int64(f.period), Burst: f.burst}, nil
}

// commitResult is what commit prints.
type commitResult struct {
	Rule         string `json:"rule"`
	Key          string `json:"key"`
	GrantID      string `json:"grantId"`
	Used         int64  `json:"used"`
	Remaining    int64  `json:"remaining"`
	Debt         int64  `json:"debt"`
	RetryAfter   string `json:"retryAfter"`
	RetryAfterNs int64  `json:"retryAfterNs"`
}

func newCommitCmd(a *app) *cobra.Command {
	var (
		grant string
		used  int64
	)
	cmd := &cobra.Command{
		Use:   "commit RULE KEY --grant ID --used N",
		Short: "Settle a reservation: charge what the work really used",
		Long: `Settle the reservation --grant (the grant id acquire printed) at --used
tokens. Less than reserved gives the difference back; more charges the extra,
even past zero: that is debt, and the key is denied until it is repaid
("retry after" says how long). A grant is settled once: committing it again
changes nothing and answers the same balance. A reservation not committed
within the rule's reservation TTL is settled at its estimate.`,
		Example: `  tokenctl acquire llm tenant-a --permits 500 -o json   # reserve an estimate
  tokenctl commit llm tenant-a --grant Al8cCpOyfk0WOpwOL3G4TQUAAAAAAAAAAcR9IemgO29Y --used 730`,
		Args: argNames("RULE", "KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireFlags(cmd, "grant", "used"); err != nil {
				return err
			}
			if grant == "" {
				return usagef("--grant is empty")
			}
			if used < 0 {
				return usagef("--used must be >= 0, got %d", used)
			}
			tc, _, done, err := a.clients()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := a.context(cmd, 0)
			defer cancel()
			req := &pb.CommitTokenRequest{Rule: args[0], Key: args[1], GrantId: grant, Used: used}
			var resp *pb.CommitTokenResponse
			err = a.call(ctx, fmt.Sprintf("commit %q of rule %q", args[1], args[0]), func(ctx context.Context) (err error) {
				resp, err = tc.CommitToken(ctx, req)
				return err
			})
			if err != nil {
				return err
			}
			res := commitResult{Rule: args[0], Key: args[1], GrantID: grant, Used: used, Remaining: resp.GetRemaining(),
				Debt: resp.GetDebt(), RetryAfterNs: resp.GetRetryAfterNs(), RetryAfter: fmtNs(resp.GetRetryAfterNs())}
			if a.structured() {
				return a.write(res)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "remaining:\t%d\ndebt:\t%d\nretry after:\t%s\n", res.Remaining, res.Debt, res.RetryAfter)
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&grant, "grant", "", "the grant id that acquire printed (required)")
	cmd.Flags().Int64Var(&used, "used", 0, "tokens the work really used (required, >= 0)")
	return cmd
}
