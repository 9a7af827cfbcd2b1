package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func newSnapshotCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Back up and restore the rules: save, restore",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	save := &cobra.Command{
		Use:   "save FILE",
		Short: "Write a Raft snapshot of the cluster's rules to FILE",
		Long: `Write a Raft snapshot, taken on the leader, to FILE (- for stdout). It holds
the rule table and the membership it was taken in; restore uses the rules.
The file is written to a temporary name first and renamed when complete.`,
		Example: `  tokenctl snapshot save backup.snap`,
		Args:    argNames("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := adminRPC(a, cmd, "snapshot save", func(ctx context.Context, c pb.AdminServiceClient) ([]byte, error) {
				stream, err := c.SnapshotSave(ctx, &pb.SnapshotSaveRequest{})
				if err != nil {
					return nil, err
				}
				var data []byte
				for {
					chunk, err := stream.Recv()
					if errors.Is(err, io.EOF) {
						return data, nil
					}
					if err != nil {
						return nil, err
					}
					data = append(data, chunk.GetData()...)
				}
			})
			if err != nil {
				return err
			}
			if args[0] == "-" {
				_, err = a.stdout.Write(data)
				return err
			}
			if err := writeFileAtomic(args[0], data); err != nil {
				return err
			}
			if a.structured() {
				return a.write(map[string]any{"file": args[0], "bytes": len(data)})
			}
			fmt.Fprintf(a.stdout, "saved %d bytes to %s\n", len(data), args[0])
			return nil
		},
	}
	restore := &cobra.Command{
		Use:   "restore FILE",
		Short: "Replace the cluster's rules with those of a snapshot",
		Long: `Replace the whole rule table with the rules of a snapshot made by
'snapshot save' (of this cluster or another), as one replicated change;
rules not in the snapshot are deleted. Membership is kept. Restored rules
start fresh buckets. FILE - reads stdin.`,
		Example: `  tokenctl snapshot restore backup.snap`,
		Args:    argNames("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := readSource(cmd, args[0])
			if err != nil {
				return err
			}
			if len(data) == 0 {
				return fmt.Errorf("%s is empty", sourceName(args[0]))
			}
			resp, err := adminRPC(a, cmd, "snapshot restore", func(ctx context.Context, c pb.AdminServiceClient) (*pb.SnapshotRestoreResponse, error) {
				stream, err := c.SnapshotRestore(ctx)
				if err != nil {
					return nil, err
				}
				for b := data; len(b) > 0; {
					k := min(len(b), 256<<10)
					if err := stream.Send(&pb.SnapshotChunk{Data: b[:k]}); err != nil {
						break // CloseAndRecv returns the real error
					}
					b = b[k:]
				}
				return stream.CloseAndRecv()
			})
			if err != nil {
				return err
			}
			if a.structured() {
				return a.write(resp)
			}
			fmt.Fprintf(a.stdout, "restored %d rules at version %d\n", resp.GetRules(), resp.GetVersion())
			return nil
		},
	}
	cmd.AddCommand(save, restore)
	return cmd
}

// writeFileAtomic writes data to a temporary file beside path and renames
// it, so a failed save never leaves a partial file under path.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
