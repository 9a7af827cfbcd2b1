package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func newClusterCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Cluster membership: status, join, remove, drain",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the members as the answering node sees them",
		Args:  argNames(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := adminRPC(a, cmd, "cluster status", func(ctx context.Context, c pb.AdminServiceClient) (*pb.ClusterStatusResponse, error) {
				return c.ClusterStatus(ctx, &pb.ClusterStatusRequest{})
			})
			if err != nil {
				return err
			}
			if a.structured() {
				return a.write(resp)
			}
			leader := resp.GetLeader()
			if leader == "" {
				leader = "(none known)"
			}
			fmt.Fprintf(a.stdout, "leader: %s  epoch: %d  answered by: %s\n", leader, resp.GetEpoch(), resp.GetAnsweredBy())
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tGRPC\tRAFT\tROLE\tSUFFRAGE\tLIVE\tREADY\tHEALTHY\tTERM\tCOMMIT\tAPPLIED\tSTABILIZATION")
			for _, m := range resp.GetMembers() {
				suffrage := m.GetSuffrage()
				if suffrage == "" {
					suffrage = map[bool]string{true: "voter", false: "nonvoter"}[m.GetVoter()]
				}
				health, stab := "?", m.GetStabilization()
				if stab != "" {
					health = fmt.Sprintf("%t (%s)", m.GetHealthy(), m.GetHealthFor().AsDuration().Round(time.Second))
				} else {
					stab = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%t\t%t\t%s\t%d\t%d\t%d\t%s\n", m.GetId(), m.GetGrpcAddr(), m.GetRaftAddr(), m.GetRole(),
					suffrage, m.GetLive(), m.GetReady(), health, m.GetTerm(), m.GetCommitIndex(), m.GetAppliedIndex(), stab)
			}
			return tw.Flush()
		},
	}
	var raftAddr, grpcAddr string
	join := &cobra.Command{
		Use:   "join ID RAFT_ADDR GRPC_ADDR",
		Short: "Add a node to the cluster as a non-voter; autopilot promotes it once stable",
		Long: `Add a node to the cluster. The node must answer at RAFT_ADDR as ID with
GRPC_ADDR, or the join is refused. It enters as a non-voter and is promoted
to voter once it has stayed healthy (caught up) for the servers'
--stabilization-time, up to --max-voters. An ID already in the cluster with
another address is replaced only after the old member has been unreachable
for the stabilization time. Nodes started with --join do this themselves.`,
		Example: `  tokenctl cluster join node-4 10.0.0.4:7071 10.0.0.4:7070
  tokenctl cluster join node-4 --raft-addr 10.0.0.4:7071 --grpc-addr 10.0.0.4:7070`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 3 {
				return argNames("ID", "RAFT_ADDR", "GRPC_ADDR")(cmd, args)
			}
			return argNames("ID")(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 3 {
				raftAddr, grpcAddr = args[1], args[2]
			} else if err := requireFlags(cmd, "raft-addr", "grpc-addr"); err != nil {
				return err
			}
			return a.simpleAdmin(cmd, fmt.Sprintf("join %s", args[0]), fmt.Sprintf("node %s joined", args[0]),
				func(ctx context.Context, c pb.AdminServiceClient) error {
					_, err := c.JoinCluster(ctx, &pb.JoinClusterRequest{Id: args[0], RaftAddr: raftAddr, GrpcAddr: grpcAddr})
					return err
				})
		},
	}
	join.Flags().StringVar(&raftAddr, "raft-addr", "", "the node's Raft address (instead of RAFT_ADDR)")
	join.Flags().StringVar(&grpcAddr, "grpc-addr", "", "the node's gRPC address (instead of GRPC_ADDR)")
	remove := &cobra.Command{
		Use:   "remove ID",
		Short: "Take a node out of the cluster (refused when it would leave the voters without a live quorum)",
		Args:  argNames("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.simpleAdmin(cmd, fmt.Sprintf("remove %s", args[0]), fmt.Sprintf("node %s removed", args[0]),
				func(ctx context.Context, c pb.AdminServiceClient) error {
					_, err := c.RemoveMember(ctx, &pb.RemoveMemberRequest{Id: args[0]})
					return err
				})
		},
	}
	drain := &cobra.Command{
		Use:   "drain ID",
		Short: "Take a node out of the routing view until its next start (its keys move to their next owners)",
		Args:  argNames("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.simpleAdmin(cmd, fmt.Sprintf("drain %s", args[0]), fmt.Sprintf("node %s drained: out of the routing view until it restarts", args[0]),
				func(ctx context.Context, c pb.AdminServiceClient) error {
					_, err := c.DrainMember(ctx, &pb.DrainMemberRequest{Id: args[0]})
					return err
				})
		},
	}
	cmd.AddCommand(status, join, remove, drain)
	return cmd
}

// simpleAdmin runs one admin call that answers nothing but success.
func (a *app) simpleAdmin(cmd *cobra.Command, what, done string, f func(context.Context, pb.AdminServiceClient) error) error {
	if _, err := adminRPC(a, cmd, what, func(ctx context.Context, c pb.AdminServiceClient) (struct{}, error) {
		return struct{}{}, f(ctx, c)
	}); err != nil {
		return err
	}
	if a.structured() {
		return a.write(map[string]any{"ok": true, "message": done})
	}
	_, err := fmt.Fprintln(a.stdout, done)
	return err
}

// adminRPC dials --server and makes one AdminService call within
// --timeout, retrying Unavailable with backoff.
func adminRPC[T any](a *app, cmd *cobra.Command, what string, f func(context.Context, pb.AdminServiceClient) (T, error)) (T, error) {
	var out T
	_, admin, closeConn, err := a.clients()
	if err != nil {
		return out, err
	}
	defer closeConn()
	ctx, cancel := a.context(cmd, 0)
	defer cancel()
	err = a.call(ctx, what, func(ctx context.Context) (err error) {
		out, err = f(ctx, admin)
		return err
	})
	return out, err
}
