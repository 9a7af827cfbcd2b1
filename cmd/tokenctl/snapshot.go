package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
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
	var force bool
	restore := &cobra.Command{
		Use:   "restore FILE",
		Short: "Replace the cluster's rules with those of a snapshot",
		Long: `Replace the whole rule table with the rules of a snapshot made by
'snapshot save' (of this cluster or another), as one replicated change;
rules not in the snapshot are deleted. Membership is kept. Restored rules
start fresh buckets. FILE - reads stdin.

A restore that would delete rules (rules the cluster has and the snapshot
lacks) is refused, naming how many, unless --force: an empty snapshot
({}) would delete them all. The check reads the rules just before the
restore; a rule created in between is deleted without a word.`,
		Example: `  tokenctl snapshot restore backup.snap
  tokenctl snapshot restore --force backup.snap`,
		Args: argNames("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := readSource(cmd, args[0])
			if err != nil {
				return err
			}
			if len(data) == 0 {
				return fmt.Errorf("%s is empty", sourceName(args[0]))
			}
			if !force {
				if err := checkRestoreDeletes(a, cmd, sourceName(args[0]), data); err != nil {
					return err
				}
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
	restore.Flags().BoolVar(&force, "force", false, "restore even if rules not in the snapshot would be deleted")
	cmd.AddCommand(save, restore)
	return cmd
}

// checkRestoreDeletes refuses a restore of data (named name) that would
// delete rules the cluster has, naming how many and a few of them.
func checkRestoreDeletes(a *app, cmd *cobra.Command, name string, data []byte) error {
	keep, err := snapshotRuleNames(data)
	if err != nil {
		return fmt.Errorf("%s: %w; pass --force to let the server decide", name, err)
	}
	current, err := listRules(a, cmd, false)
	if err != nil {
		return err
	}
	var gone []string
	for _, r := range current {
		if !keep[r.GetName()] {
			gone = append(gone, r.GetName())
		}
	}
	if len(gone) == 0 {
		return nil
	}
	shown := gone[:min(len(gone), 5)]
	more := ""
	if len(gone) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(gone)-len(shown))
	}
	return fmt.Errorf("restoring %s would delete %d of the cluster's %d rules (%s%s), which the snapshot lacks; pass --force to restore anyway",
		name, len(gone), len(current), strings.Join(shown, ", "), more)
}

// snapshotRuleNames reads the names of a snapshot's rules, in either
// format the server reads (internal/raftfsm's snapformat.go): "TSS" and
// the format version, then a raft.v1.Snapshot; or the first release's
// JSON, whose "rules" maps names to rules.
func snapshotRuleNames(data []byte) (map[string]bool, error) {
	names := map[string]bool{}
	if len(data) >= len(snapshotMagic) && string(data[:3]) == snapshotMagic[:3] {
		if data[3] != snapshotMagic[3] {
			return nil, fmt.Errorf("snapshot format %d is newer than this tokenctl reads (%d)", data[3], snapshotMagic[3])
		}
		var m raftv1.Snapshot
		if err := proto.Unmarshal(data[len(snapshotMagic):], &m); err != nil {
			return nil, fmt.Errorf("decode snapshot: %w", err)
		}
		for _, r := range m.GetRules() {
			names[r.GetName()] = true
		}
		return names, nil
	}
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, errors.New("not a tokenserver snapshot")
	}
	var v0 struct {
		Rules map[string]json.RawMessage `json:"rules"`
	}
	if err := json.Unmarshal(data, &v0); err != nil {
		return nil, fmt.Errorf("decode snapshot (first format): %w", err)
	}
	for n := range v0.Rules {
		names[n] = true
	}
	return names, nil
}

// snapshotMagic starts a snapshot of the current format (see
// internal/raftfsm's snapformat.go, which this must match): "TSS" and the
// format version.
const snapshotMagic = "TSS\x01"

// writeFileAtomic writes data to a temporary file beside path and renames
// it, so a failed save never leaves a partial file under path. The file
// gets mode 0600.
func writeFileAtomic(path string, data []byte) error {
	return writeFileAtomicMode(path, data, 0o600)
}

// writeFileAtomicMode is writeFileAtomic with the file's mode.
func writeFileAtomicMode(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
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
