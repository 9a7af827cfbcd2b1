package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// newEnvoyCmd groups the Envoy rate-limit domain commands.
func newEnvoyCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "envoy",
		Short: "Envoy rate-limit domains (envoyproxy/ratelimit's YAML), replicated like rules",
		RunE:  groupRunE,
	}
	cmd.AddCommand(newEnvoyApplyCmd(a), newEnvoyGetCmd(a), newEnvoyListCmd(a), newEnvoyDeleteCmd(a))
	return cmd
}

func newEnvoyApplyCmd(a *app) *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "apply -f FILE...",
		Short: "Create or replace the domain of each file (validated by the server as the reference would)",
		Args:  argNames(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return fmt.Errorf("no file: pass -f FILE")
			}
			var out []*pb.EnvoyDomain
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					return fmt.Errorf("read %s: %w", f, err)
				}
				resp, err := adminRPC(a, cmd, "put envoy domain of "+f, func(ctx context.Context, c pb.AdminServiceClient) (*pb.PutEnvoyDomainResponse, error) {
					return c.PutEnvoyDomain(ctx, &pb.PutEnvoyDomainRequest{Yaml: string(b), Source: filepath.Base(f)})
				})
				if err != nil {
					return err
				}
				out = append(out, resp.GetDomain())
				if !a.structured() {
					fmt.Fprintf(a.stdout, "envoy domain %q applied (version %d)\n", resp.GetDomain().GetDomain(), resp.GetDomain().GetVersion())
				}
			}
			if a.structured() {
				return writeEnvoyDomainsJSON(a, out)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVarP(&files, "file", "f", nil, "YAML file of one domain (repeat, or comma-separate)")
	return cmd
}

func newEnvoyGetCmd(a *app) *cobra.Command {
	var local bool
	cmd := &cobra.Command{
		Use:   "get DOMAIN",
		Short: "Print one domain: its metadata, then its YAML",
		Args:  argNames("DOMAIN"),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := adminRPC(a, cmd, fmt.Sprintf("get envoy domain %q", args[0]), func(ctx context.Context, c pb.AdminServiceClient) (*pb.EnvoyDomain, error) {
				return c.GetEnvoyDomain(ctx, &pb.GetEnvoyDomainRequest{Domain: args[0], Local: local})
			})
			if err != nil {
				return err
			}
			if a.structured() {
				return a.write(d)
			}
			fmt.Fprintf(a.stdout, "# domain %s, version %d, by %s, from %s\n%s", d.GetDomain(), d.GetVersion(), d.GetAuthor(), d.GetSource(), d.GetYaml())
			return nil
		},
	}
	cmd.Flags().BoolVar(&local, "local", false, "read the answering node's own copy instead of the leader's")
	return cmd
}

func newEnvoyListCmd(a *app) *cobra.Command {
	var local bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the domains with their version, author and source",
		Long:  "List the domains, sorted by name. With -o json or -o yaml: an object whose \"domains\" is the list.",
		Args:  argNames(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := adminRPC(a, cmd, "list envoy domains", func(ctx context.Context, c pb.AdminServiceClient) (*pb.ListEnvoyDomainsResponse, error) {
				return c.ListEnvoyDomains(ctx, &pb.ListEnvoyDomainsRequest{Local: local})
			})
			if err != nil {
				return err
			}
			if a.structured() {
				return writeEnvoyDomainsJSON(a, resp.GetDomains())
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "DOMAIN\tVERSION\tAUTHOR\tSOURCE")
			for _, d := range resp.GetDomains() {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", d.GetDomain(), d.GetVersion(), d.GetAuthor(), d.GetSource())
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&local, "local", false, "read the answering node's own copy instead of the leader's")
	return cmd
}

func newEnvoyDeleteCmd(a *app) *cobra.Command {
	var expected int64
	cmd := &cobra.Command{
		Use:   "delete DOMAIN",
		Short: "Delete one domain",
		Args:  argNames("DOMAIN"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &pb.DeleteEnvoyDomainRequest{Domain: args[0]}
			if expected >= 0 {
				v := uint64(expected)
				req.ExpectedVersion = &v
			}
			if _, err := adminRPC(a, cmd, fmt.Sprintf("delete envoy domain %q", args[0]), func(ctx context.Context, c pb.AdminServiceClient) (*pb.DeleteEnvoyDomainResponse, error) {
				return c.DeleteEnvoyDomain(ctx, req)
			}); err != nil {
				return err
			}
			if a.structured() {
				return a.write(map[string]string{"deleted": args[0]})
			}
			fmt.Fprintf(a.stdout, "envoy domain %q deleted\n", args[0])
			return nil
		},
	}
	cmd.Flags().Int64Var(&expected, "expected-version", -1, "delete only if the domain is at this version (-1: any)")
	return cmd
}

func writeEnvoyDomainsJSON(a *app, ds []*pb.EnvoyDomain) error {
	list := make([]json.RawMessage, len(ds))
	for i, d := range ds {
		raw, err := protoJSON(d)
		if err != nil {
			return err
		}
		list[i] = raw
	}
	return a.write(map[string]any{"domains": list})
}
