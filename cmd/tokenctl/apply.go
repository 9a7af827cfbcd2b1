package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tokenserver/tokenserver/internal/rulefile"
	"github.com/tokenserver/tokenserver/internal/rulepb"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func newRuleApplyCmd(a *app) *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or replace the rules of YAML files",
		Long: `Create or replace the rules of YAML (or JSON) files; -f - reads stdin.

A file holds one rule, a list of rules, an object {rules: [...]} (what
'rule list -o json' prints), or several of these as YAML documents separated
by '---'. Field names are the proto's JSON names (sampleCount; sample_count
works too), durations read like 1s or 250ms, and the algorithm is
TOKEN_BUCKET or token-bucket. Unknown fields are errors.

Every rule is read and validated before any is sent; then each is put in
order, and one line per rule shows its name and new version.`,
		Example: `  tokenctl rule apply -f rules.yaml
  cat rules.yaml | tokenctl rule apply -f -

  # rules.yaml
  name: api
  algorithm: TOKEN_BUCKET
  limit: 100
  period: 1s
  burst: 200
  ---
  - name: login
    algorithm: sliding-log
    limit: 5
    period: 1m
    penalty: 5m`,
		Args: argNames(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return usagef("-f/--filename is required")
			}
			var rules []*pb.Rule
			seen := map[string]rulefile.Pos{} // rule name → where first
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
					if first, dup := seen[r.Rule.Name]; dup {
						return fmt.Errorf("%s: rule %q appears again (first at %s)", r.Pos, r.Rule.Name, first)
					}
					seen[r.Rule.Name] = r.Pos
					pr := rulepb.ToProto(r.Rule)
					pr.Durable = pr.GetDurable() || r.Durable
					rules = append(rules, pr)
				}
			}
			if len(rules) == 0 {
				names := make([]string, len(files))
				for i, f := range files {
					names[i] = sourceName(f)
				}
				return fmt.Errorf("no rules in %s", strings.Join(names, ", "))
			}
			_, admin, done, err := a.clients()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := a.context(cmd, 0)
			defer cancel()
			stored := make([]*pb.Rule, 0, len(rules))
			for _, r := range rules {
				var resp *pb.PutRuleResponse
				// One request id per write, the same across its retries.
				req := &pb.PutRuleRequest{Rule: r, RequestId: newRequestID()}
				err := a.call(ctx, fmt.Sprintf("put rule %q", r.GetName()), func(ctx context.Context) (err error) {
					resp, err = admin.PutRule(ctx, req)
					return err
				})
				if err != nil {
					if len(stored) > 0 {
						a.logf("applied %d of %d rules before the error", len(stored), len(rules))
						if !a.structured() {
							_ = writeApplied(a.stdout, stored)
						}
					}
					return err
				}
				stored = append(stored, resp.GetRule())
			}
			if a.structured() {
				return a.writeRules(stored)
			}
			return writeApplied(a.stdout, stored)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "YAML file of rules, - for stdin (repeatable)")
	return cmd
}

// writeApplied prints one line per applied rule: its name and version.
func writeApplied(w io.Writer, rules []*pb.Rule) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION")
	for _, r := range rules {
		fmt.Fprintf(tw, "%s\t%d\n", r.GetName(), r.GetVersion())
	}
	return tw.Flush()
}

func sourceName(f string) string {
	if f == "-" {
		return "<stdin>"
	}
	return f
}

// readSource reads a file, or stdin for "-".
func readSource(cmd *cobra.Command, f string) ([]byte, error) {
	if f == "-" {
		b, err := io.ReadAll(cmd.InOrStdin())
		if err != nil {
			return nil, fmt.Errorf("read stdin: %w", err)
		}
		return b, nil
	}
	b, err := os.ReadFile(f)
	if err != nil {
		return nil, err
	}
	return b, nil
}
