package server

import (
	"bytes"
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// maxSnapshot bounds a snapshot a node accepts for restore.
const maxSnapshot = 256 << 20

// snapshotChunk is the size of the pieces a snapshot travels in.
const snapshotChunk = 256 << 10

// SnapshotSave implements pb.AdminServiceServer: it streams the leader's
// snapshot; a follower relays the leader's stream.
func (s *adminService) SnapshotSave(req *pb.SnapshotSaveRequest, stream grpc.ServerStreamingServer[pb.SnapshotChunk]) error {
	ctx := stream.Context()
	rc, err := s.n.control.SnapshotSave(ctx)
	if err != nil {
		var le *rule.LeaderError
		if !errors.As(err, &le) || forwarded(ctx) {
			return toError(err)
		}
		conn, cerr := s.n.peers.connTo(le.ID, le.GRPCAddr)
		if cerr != nil {
			return peerError("leader "+le.ID, cerr)
		}
		up, uerr := pb.NewAdminServiceClient(conn).SnapshotSave(markForwarded(ctx), req)
		if uerr != nil {
			return peerError("leader "+le.ID, uerr)
		}
		for {
			c, rerr := up.Recv()
			if errors.Is(rerr, io.EOF) {
				return nil
			}
			if rerr != nil {
				return peerError("leader "+le.ID, rerr)
			}
			if err := stream.Send(c); err != nil {
				return err
			}
		}
	}
	defer rc.Close()
	buf := make([]byte, snapshotChunk)
	for {
		n, rerr := io.ReadFull(rc, buf)
		if n > 0 {
			if err := stream.Send(&pb.SnapshotChunk{Data: buf[:n]}); err != nil {
				return err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return nil
		}
		if rerr != nil {
			return toError(failf(ErrInternal, "read snapshot: %v", rerr))
		}
	}
}

// SnapshotRestore implements pb.AdminServiceServer: it reads the whole
// snapshot, then restores it on the leader (a follower forwards it).
func (s *adminService) SnapshotRestore(stream grpc.ClientStreamingServer[pb.SnapshotChunk, pb.SnapshotRestoreResponse]) error {
	ctx := stream.Context()
	var data bytes.Buffer
	for {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if data.Len()+len(c.GetData()) > maxSnapshot {
			return toError(failf(ErrBadRequest, "snapshot is larger than %d MiB", maxSnapshot>>20))
		}
		data.Write(c.GetData())
	}
	if data.Len() == 0 {
		return toError(failf(ErrBadRequest, "snapshot is empty"))
	}
	n, version, err := s.n.control.RestoreRules(raftfsm.WithAuthor(ctx, actor(ctx)), bytes.NewReader(data.Bytes()))
	if err != nil {
		var resp *pb.SnapshotRestoreResponse
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) error {
			up, err := c.SnapshotRestore(ctx)
			if err != nil {
				return err
			}
			for b := data.Bytes(); len(b) > 0; {
				k := min(len(b), snapshotChunk)
				if err := up.Send(&pb.SnapshotChunk{Data: b[:k]}); err != nil {
					return err
				}
				b = b[k:]
			}
			resp, err = up.CloseAndRecv()
			return err
		})
		if err != nil {
			return err
		}
		return stream.SendAndClose(resp)
	}
	s.n.log.Info("snapshot restored", "rules", n, "version", version)
	return stream.SendAndClose(&pb.SnapshotRestoreResponse{Rules: int64(n), Version: version})
}
