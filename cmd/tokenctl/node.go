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
			if a.json() {
				return writeJSON(a.stdout, nodeStatusJSON{ID: ns.GetId(), Role: ns.GetRole(), Term: ns.GetTerm(), CommitIndex: ns.GetCommitIndex(),
					AppliedIndex: ns.GetAppliedIndex(), LastIndex: ns.GetLastIndex(), Leader: ns.GetLeader(), Epoch: ns.GetEpoch(), Ready: ns.GetReady(),
					Draining: ns.GetDraining(), Insecure: ns.GetInsecure(), Rules: ns.GetRules(), RulesDigest: ns.GetRulesDigest(), Version: ns.GetVersion()})
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

// nodeStatusJSON is `node status -o json`: snake_case names, every field
// present.
type nodeStatusJSON struct {
	ID           string `json:"id"`
	Role         string `json:"role"`
	Term         uint64 `json:"term"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	LastIndex    uint64 `json:"last_index"`
	Leader       string `json:"leader"`
	Epoch        uint64 `json:"epoch"`
	Ready        bool   `json:"ready"`
	Draining     bool   `json:"draining"`
	Insecure     bool   `json:"insecure"`
	Rules        uint64 `json:"rules"`
	RulesDigest  string `json:"rules_digest"`
	Version      string `json:"version"`
}
