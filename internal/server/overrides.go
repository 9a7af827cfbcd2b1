package server

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// overrideStore is what the control plane offers for runtime overrides
// (raftfsm.Node, through RaftCluster and Standalone).
type overrideStore interface {
	PutOverride(ctx context.Context, o rule.RuntimeOverride) (rule.RuntimeOverride, error)
	DeleteOverride(ctx context.Context, name, key string) error
	ListOverrides(name string) ([]rule.RuntimeOverride, error)
	ExpireOverrides(ctx context.Context, nowUnixNs int64) (int, error)
	IsLeader() bool
}

// OverrideExpiryInterval is how often the leader removes expired runtime
// overrides: an override lives at most this much past its expiry.
const OverrideExpiryInterval = time.Second

// MaxOverridePage is the most overrides one ListOverrides answer holds.
const MaxOverridePage = 1000

func (n *Node) overrides() (overrideStore, error) {
	s, ok := n.control.(overrideStore)
	if !ok {
		return nil, failf(ErrNoRaft, "this node's control plane keeps no runtime overrides")
	}
	return s, nil
}

func overrideToProto(o rule.RuntimeOverride) *pb.RuleOverride {
	return &pb.RuleOverride{Rule: o.Rule, Key: o.Key, Limit: o.Limit, Burst: o.Burst,
		ExpiresUnixNs: o.ExpiresUnixNs, Version: o.Version, UpdatedBy: o.UpdatedBy}
}

// PutOverride implements pb.AdminServiceServer: one Raft entry on the
// leader (a follower forwards), audited with the caller's principal.
func (s *adminService) PutOverride(ctx context.Context, req *pb.PutOverrideRequest) (*pb.PutOverrideResponse, error) {
	in := req.GetOverride()
	if in == nil {
		return nil, toError(failf(ErrBadRequest, "override is missing"))
	}
	if err := s.n.checkScope(ctx, in.GetRule()); err != nil {
		return nil, toError(err)
	}
	store, err := s.n.overrides()
	if err != nil {
		return nil, toError(err)
	}
	o := rule.RuntimeOverride{Rule: in.GetRule(), Key: in.GetKey(), Limit: in.GetLimit(), Burst: in.GetBurst(),
		ExpiresUnixNs: in.GetExpiresUnixNs(), UpdatedBy: actor(ctx)}
	if o.ExpiresUnixNs != 0 && o.ExpiresUnixNs <= time.Now().UnixNano() {
		return nil, toError(failf(ErrBadRequest, "expires_unix_ns %d is in the past", o.ExpiresUnixNs))
	}
	got, err := store.PutOverride(ctx, o)
	if err != nil {
		var resp *pb.PutOverrideResponse
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.PutOverride(ctx, req)
			return err
		})
		return resp, err
	}
	s.n.log.Info("override put", "rule", got.Rule, "key", got.Key, "limit", got.Limit, "burst", got.Burst, "expires_unix_ns", got.ExpiresUnixNs, "version", got.Version, "by", got.UpdatedBy)
	return &pb.PutOverrideResponse{Override: overrideToProto(got)}, nil
}

// DeleteOverride implements pb.AdminServiceServer.
func (s *adminService) DeleteOverride(ctx context.Context, req *pb.DeleteOverrideRequest) (*pb.DeleteOverrideResponse, error) {
	if err := s.n.checkScope(ctx, req.GetRule()); err != nil {
		return nil, toError(err)
	}
	store, err := s.n.overrides()
	if err != nil {
		return nil, toError(err)
	}
	if err := store.DeleteOverride(ctx, req.GetRule(), req.GetKey()); err != nil {
		var resp *pb.DeleteOverrideResponse
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.DeleteOverride(ctx, req)
			return err
		})
		return resp, err
	}
	s.n.log.Info("override deleted", "rule", req.GetRule(), "key", req.GetKey(), "by", actor(ctx))
	return &pb.DeleteOverrideResponse{}, nil
}

// ListOverrides implements pb.AdminServiceServer: from the leader's copy,
// or with `local` this node's, sorted by key, in pages (the page token is
// the last key of the previous page).
func (s *adminService) ListOverrides(ctx context.Context, req *pb.ListOverridesRequest) (*pb.ListOverridesResponse, error) {
	if err := rule.ValidName(req.GetRule()); err != nil {
		return nil, toError(err)
	}
	if err := s.n.checkScope(ctx, req.GetRule()); err != nil {
		return nil, toError(err)
	}
	store, err := s.n.overrides()
	if err != nil {
		return nil, toError(err)
	}
	if !req.GetLocal() && !store.IsLeader() {
		id, addr := s.n.data.Leader()
		if id == "" {
			return nil, toError(fmt.Errorf("list overrides: %w", rule.ErrNoLeader))
		}
		var resp *pb.ListOverridesResponse
		err := s.n.onLeader(ctx, &rule.LeaderError{ID: id, GRPCAddr: addr}, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.ListOverrides(ctx, req)
			return err
		})
		return resp, err
	}
	all, err := store.ListOverrides(req.GetRule())
	if err != nil {
		return nil, toError(err)
	}
	size := int(req.GetPageSize())
	if size <= 0 || size > MaxOverridePage {
		size = MaxOverridePage
	}
	i := 0
	if t := req.GetPageToken(); t != "" {
		i = sort.Search(len(all), func(i int) bool { return all[i].Key > t })
	}
	resp := &pb.ListOverridesResponse{}
	for ; i < len(all) && len(resp.Overrides) < size; i++ {
		resp.Overrides = append(resp.Overrides, overrideToProto(all[i]))
	}
	if i < len(all) {
		resp.NextPageToken = all[i-1].Key
	}
	return resp, nil
}

// expireOverrides runs on every node and acts on the leader: every
// OverrideExpiryInterval it removes the runtime overrides whose expiry
// passed (one Raft entry per rule holding some).
func (n *Node) expireOverrides() {
	defer n.wg.Done()
	store, err := n.overrides()
	if err != nil {
		return
	}
	t := time.NewTicker(OverrideExpiryInterval)
	defer t.Stop()
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
			if !store.IsLeader() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), OverrideExpiryInterval*5)
			if k, err := store.ExpireOverrides(ctx, time.Now().UnixNano()); err != nil {
				n.log.Warn("removing expired overrides", "err", err)
			} else if k > 0 {
				n.log.Info("expired overrides removed", "rules", k, "by", "leader")
			}
			cancel()
		}
	}
}

// checkScope refuses a scoped caller a rule name outside its scope (see
// auth.CheckName).
func (n *Node) checkScope(ctx context.Context, name string) error {
	return auth.CheckName(ctx, name)
}
