package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func newOverrideCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "override",
		Short: "Set, list and delete runtime overrides of a rule",
		Long: `Runtime overrides give one key, or every key under a prefix (a KEY ending
in one '*', like premium-*), its own limit without rewriting the rule. Each is
its own replicated entry: writing one costs the same with 100,000 overrides as
with 10. The longest matching prefix wins; an exact key beats a prefix.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(newOverrideSetCmd(a), newOverrideListCmd(a), newOverrideDeleteCmd(a))
	return cmd
}

func newOverrideSetCmd(a *app) *cobra.Command {
	var (
		limit, burst int64
		expires      time.Duration
	)
	cmd := &cobra.Command{
		Use:   "set RULE KEY --limit N [--burst N] [--expires D]",
		Short: "Give a key or key prefix its own limit",
		Example: `  tokenctl override set llm acme --limit 50000
  tokenctl override set llm 'premium-*' --limit 10000 --burst 20000 --expires 720h`,
		Args: argNames("RULE", "KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireFlags(cmd, "limit"); err != nil {
				return err
			}
			if limit <= 0 {
				return usagef("--limit: must be > 0, got %d", limit)
			}
			if cmd.Flags().Changed("burst") && burst <= 0 {
				return usagef("--burst: must be > 0, got %d", burst)
			}
			o := &pb.RuleOverride{Rule: args[0], Key: args[1], Limit: limit, Burst: burst}
			if cmd.Flags().Changed("expires") {
				if expires <= 0 {
					return usagef("--expires: must be > 0, got %v", expires)
				}
				o.ExpiresUnixNs = time.Now().Add(expires).UnixNano()
			}
			resp, err := adminRPC(a, cmd, fmt.Sprintf("set override %q of rule %q", o.GetKey(), o.GetRule()), func(ctx context.Context, c pb.AdminServiceClient) (*pb.PutOverrideResponse, error) {
				return c.PutOverride(ctx, &pb.PutOverrideRequest{Override: o})
			})
			if err != nil {
				return err
			}
			if a.structured() {
				return a.write(resp.GetOverride())
			}
			return writeOverridesTable(a.stdout, []*pb.RuleOverride{resp.GetOverride()})
		},
	}
	fl := cmd.Flags()
	fl.Int64Var(&limit, "limit", 0, "the key's limit per the rule's period (required)")
	fl.Int64Var(&burst, "burst", 0, "the key's burst (default: its limit)")
	fl.DurationVar(&expires, "expires", 0, "remove the override after this long (default: never)")
	return cmd
}

func newOverrideListCmd(a *app) *cobra.Command {
	var local bool
	cmd := &cobra.Command{
		Use:   "list RULE",
		Short: "List a rule's runtime overrides, sorted by key",
		Long:  `List a rule's runtime overrides, sorted by key. With -o json or -o yaml: an object whose "overrides" is the list.`,
		Args:  argNames("RULE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var all []*pb.RuleOverride
			token := ""
			for page := 1; ; page++ {
				resp, err := adminRPC(a, cmd, fmt.Sprintf("list overrides of rule %q (page %d)", args[0], page), func(ctx context.Context, c pb.AdminServiceClient) (*pb.ListOverridesResponse, error) {
					return c.ListOverrides(ctx, &pb.ListOverridesRequest{Rule: args[0], Local: local, PageToken: token})
				})
				if err != nil {
					return err
				}
				all = append(all, resp.GetOverrides()...)
				next := resp.GetNextPageToken()
				if next == "" || next == token {
					break
				}
				token = next
			}
			if a.structured() {
				return a.write(&pb.ListOverridesResponse{Overrides: all})
			}
			if len(all) == 0 {
				a.logf("no overrides of rule %s", args[0])
				return nil
			}
			return writeOverridesTable(a.stdout, all)
		},
	}
	cmd.Flags().BoolVar(&local, "local", false, "read the answering node's own copy instead of the leader's")
	return cmd
}

func newOverrideDeleteCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "delete RULE KEY",
		Short: "Delete a runtime override",
		Args:  argNames("RULE", "KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := adminRPC(a, cmd, fmt.Sprintf("delete override %q of rule %q", args[1], args[0]), func(ctx context.Context, c pb.AdminServiceClient) (*pb.DeleteOverrideResponse, error) {
				return c.DeleteOverride(ctx, &pb.DeleteOverrideRequest{Rule: args[0], Key: args[1]})
			})
			if err != nil {
				return err
			}
			if a.structured() {
				return a.write(map[string]string{"rule": args[0], "deleted": args[1]})
			}
			_, err = fmt.Fprintf(a.stdout, "deleted override %s of rule %s\n", args[1], args[0])
			return err
		},
	}
}

// writeOverridesTable writes overrides as a table, one row each.
func writeOverridesTable(w io.Writer, list []*pb.RuleOverride) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tKEY\tLIMIT\tBURST\tEXPIRES\tVERSION\tUPDATED BY")
	for _, o := range list {
		burst := fmt.Sprint(o.GetBurst())
		if o.GetBurst() == 0 {
			burst = "(limit)"
		}
		expires := "never"
		if e := o.GetExpiresUnixNs(); e != 0 {
			expires = time.Unix(0, e).UTC().Format(time.RFC3339)
		}
		by := o.GetUpdatedBy()
		if by == "" {
			by = "-"
		}
		fmt.Fprintln(tw, strings.Join([]string{o.GetRule(), o.GetKey(), fmt.Sprint(o.GetLimit()), burst, expires, fmt.Sprint(o.GetVersion()), by}, "\t"))
	}
	return tw.Flush()
}
