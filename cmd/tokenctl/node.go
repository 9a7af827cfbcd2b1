package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// newNodeCmd is `tokenctl node status`: the answering node alone, as it
// sees itself (no call to the leader): useful when there is no leader, as
// when picking the survivor to recover after a lost quorum.
func newNodeCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "The answering node on its own: status",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the answering node's own state: role, indexes, readiness, draining, build, --insecure",
		Args:  argNames(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ns, err := adminRPC(a, cmd, "node status", func(ctx context.Context, c pb.AdminServiceClient) (*pb.NodeStatusResponse, error) {
				return c.NodeStatus(ctx, &pb.NodeStatusRequest{})
			})
			if err != nil {
				return err
			}
			if ns.GetInsecure() {
				a.logf("warning: node %s serves without TLS or authentication off loopback (--insecure)", ns.GetId())
			}
			if a.structured() {
				return a.write(ns)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			for _, row := range [][2]any{
				{"id", ns.GetId()}, {"role", ns.GetRole()}, {"leader", ns.GetLeader()}, {"term", ns.GetTerm()},
				{"commit index", ns.GetCommitIndex()}, {"applied index", ns.GetAppliedIndex()}, {"last index", ns.GetLastIndex()},
				{"epoch", ns.GetEpoch()}, {"ready", ns.GetReady()}, {"draining", ns.GetDraining()}, {"insecure", ns.GetInsecure()},
				{"rules", ns.GetRules()}, {"rules digest", ns.GetRulesDigest()}, {"version", ns.GetVersion()},
			} {
				fmt.Fprintf(tw, "%s:\t%v\n", row[0], row[1])
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(status)
	return cmd
}
