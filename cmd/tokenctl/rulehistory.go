package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tokenserver/tokenserver/internal/rulefile"
	"github.com/tokenserver/tokenserver/internal/rulepb"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// newRuleHistoryCmds are the rule subcommands over its history: history,
// rollback and diff.
func newRuleHistoryCmds(a *app) []*cobra.Command {
	return []*cobra.Command{newRuleHistoryCmd(a), newRuleRollbackCmd(a), newRuleDiffCmd(a)}
}

// ruleVersionJSON is one version of `rule history -o json`.
type ruleVersionJSON struct {
	Version   uint64          `json:"version"`
	Change    string          `json:"change"`
	Principal string          `json:"principal"`
	Time      string          `json:"time"`
	Rule      json.RawMessage `json:"rule"`
}

func newRuleHistoryCmd(a *app) *cobra.Command {
	var local bool
	cmd := &cobra.Command{
		Use:   "history NAME",
		Short: "Print a rule's last versions, newest first, with who changed it and when",
		Args:  argNames("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := adminRPC(a, cmd, fmt.Sprintf("history of rule %q", args[0]), func(ctx context.Context, c pb.AdminServiceClient) (*pb.RuleHistoryResponse, error) {
				return c.RuleHistory(ctx, &pb.RuleHistoryRequest{Name: args[0], Local: local})
			})
			if err != nil {
				return err
			}
			if a.structured() {
				out := struct {
					Versions []ruleVersionJSON `json:"versions"`
				}{Versions: make([]ruleVersionJSON, 0, len(resp.GetVersions()))}
				for _, v := range resp.GetVersions() {
					j := ruleVersionJSON{Version: v.GetVersion(), Change: v.GetChange(), Principal: v.GetPrincipal(), Time: fmtUnixNs(v.GetTimeUnixNs()), Rule: json.RawMessage("null")}
					if v.GetRule() != nil {
						if j.Rule, err = protoJSON(v.GetRule()); err != nil {
							return err
						}
					}
					out.Versions = append(out.Versions, j)
				}
				return a.write(out)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tCHANGE\tBY\tTIME\tLIMIT\tPERIOD\tALGORITHM")
			for _, v := range resp.GetVersions() {
				limit, period, alg := "-", "-", "-"
				if r := v.GetRule(); r != nil {
					limit, period, alg = fmt.Sprint(r.GetLimit()), fmtDur(r.GetPeriod()), algorithmName(r.GetAlgorithm())
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", v.GetVersion(), v.GetChange(), orDash(v.GetPrincipal()), fmtUnixNs(v.GetTimeUnixNs()), limit, period, alg)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&local, "local", false, "read the answering node's own copy instead of the leader's")
	return cmd
}

func newRuleRollbackCmd(a *app) *cobra.Command {
	var to, expected uint64
	cmd := &cobra.Command{
		Use:   "rollback NAME --to-version V",
		Short: "Write a new version of a rule equal to an old one (see rule history)",
		Args:  argNames("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == 0 {
				return usagef("--to-version is required")
			}
			req := &pb.RollbackRuleRequest{Name: args[0], ToVersion: to}
			if cmd.Flags().Changed("expected-version") {
				req.ExpectedVersion = &expected
			}
			resp, err := adminRPC(a, cmd, fmt.Sprintf("roll back rule %q", args[0]), func(ctx context.Context, c pb.AdminServiceClient) (*pb.PutRuleResponse, error) {
				return c.RollbackRule(ctx, req)
			})
			if err != nil {
				return err
			}
			return a.writeRule(resp.GetRule())
		},
	}
	cmd.Flags().Uint64Var(&to, "to-version", 0, "the version to copy (a VERSION of rule history)")
	cmd.Flags().Uint64Var(&expected, "expected-version", 0, "write only if the rule's current version is this (0: it must not exist)")
	return cmd
}

// ruleDiffJSON is one rule of `rule diff -o json`.
type ruleDiffJSON struct {
	Name     string          `json:"name"`
	Change   string          `json:"change"`
	Fields   []string        `json:"fields"`
	Error    string          `json:"error"`
	Current  json.RawMessage `json:"current"`
	Proposed json.RawMessage `json:"proposed"`
}

func newRuleDiffCmd(a *app) *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "diff -f FILE",
		Short: "Show what rule apply -f would change, without changing anything",
		Long: `Read rules as rule apply -f does and ask the server what putting each
would change: CREATE, UPDATE (with the fields that differ) or UNCHANGED,
or why the server would refuse it. Nothing is written. The exit code is 1
when a rule would be refused.`,
		Args: argNames(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return usagef("-f/--filename is required")
			}
			var rules []*pb.Rule
			for _, f := range files {
				data, err := readSource(cmd, f)
				if err != nil {
					return err
				}
				rs, err := rulefile.Parse(sourceName(f), data)
				if err != nil {
					return err
				}
				for _, r := range rs {
					rules = append(rules, rulepb.ToProto(r.Rule))
				}
			}
			resp, err := adminRPC(a, cmd, "diff rules", func(ctx context.Context, c pb.AdminServiceClient) (*pb.DiffRulesResponse, error) {
				return c.DiffRules(ctx, &pb.DiffRulesRequest{Rules: rules})
			})
			if err != nil {
				return err
			}
			refused := 0
			for _, d := range resp.GetDiffs() {
				if d.GetError() != "" {
					refused++
				}
			}
			if err := a.writeDiffs(resp.GetDiffs()); err != nil {
				return err
			}
			if refused > 0 {
				return fmt.Errorf("the server would refuse %d of %d rules", refused, len(resp.GetDiffs()))
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "YAML file of rules, - for stdin (repeatable)")
	return cmd
}

func (a *app) writeDiffs(diffs []*pb.RuleDiff) error {
	if a.structured() {
		out := struct {
			Diffs []ruleDiffJSON `json:"diffs"`
		}{Diffs: make([]ruleDiffJSON, 0, len(diffs))}
		for _, d := range diffs {
			j := ruleDiffJSON{Name: d.GetName(), Change: d.GetChange(), Fields: d.GetFields(), Error: d.GetError(), Current: json.RawMessage("null"), Proposed: json.RawMessage("null")}
			if j.Fields == nil {
				j.Fields = []string{}
			}
			var err error
			if d.GetCurrent() != nil {
				if j.Current, err = protoJSON(d.GetCurrent()); err != nil {
					return err
				}
			}
			if d.GetProposed() != nil {
				if j.Proposed, err = protoJSON(d.GetProposed()); err != nil {
					return err
				}
			}
			out.Diffs = append(out.Diffs, j)
		}
		return a.write(out)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tCHANGE\tDETAIL")
	for _, d := range diffs {
		change, detail := d.GetChange(), strings.Join(d.GetFields(), ", ")
		if d.GetError() != "" {
			change, detail = "REFUSED", d.GetError()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", d.GetName(), change, orDash(detail))
	}
	return tw.Flush()
}

// fmtUnixNs prints Unix nanoseconds as RFC 3339 in UTC, "-" for 0.
func fmtUnixNs(ns int64) string {
	if ns == 0 {
		return "-"
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
