package server

import (
	"context"
	"errors"

	"github.com/tokenserver/tokenserver/internal/envoyrls"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// The AdminService's Envoy domain calls: writes are validated here
// (envoyrls.ParseDomain, the reference's rules) before they are proposed,
// and go to the leader like rule writes.

func (s *adminService) envoyStore() (envoyStore, error) {
	if s.n.envoy == nil || s.n.envoy.store == nil {
		return nil, failf(ErrNoRaft, "this node keeps no Envoy domains (no Raft)")
	}
	return s.n.envoy.store, nil
}

func envoyDomainPB(d raftfsm.EnvoyDomain) *pb.EnvoyDomain {
	return &pb.EnvoyDomain{Domain: d.Name, Yaml: d.YAML, Version: d.Version, Author: d.Author, Source: d.Source}
}

// envoyNotFound is NotFound naming the domain.
func envoyNotFound(err error) error {
	if errors.Is(err, raftfsm.ErrEnvoyDomainNotFound) {
		return failf(rule.ErrNotFound, "%v", err)
	}
	return err
}

// PutEnvoyDomain implements pb.AdminServiceServer.
func (s *adminService) PutEnvoyDomain(ctx context.Context, req *pb.PutEnvoyDomainRequest) (*pb.PutEnvoyDomainResponse, error) {
	st, err := s.envoyStore()
	if err != nil {
		return nil, toError(err)
	}
	source := req.GetSource()
	if source == "" {
		source = "request"
	}
	d, err := envoyrls.ParseDomain(source, []byte(req.GetYaml()), envoyrls.Meta{Author: actor(ctx), Source: source})
	if err != nil {
		return nil, toError(envoyError(err))
	}
	stored, err := st.PutEnvoyDomain(ctx, raftfsm.EnvoyDomain{Name: d.Name(), YAML: req.GetYaml(), Author: actor(ctx), Source: source}, req.ExpectedVersion)
	if err != nil {
		var resp *pb.PutEnvoyDomainResponse
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.PutEnvoyDomain(ctx, req)
			return err
		})
		return resp, err
	}
	s.n.log.Info("envoy domain put", "domain", stored.Name, "version", stored.Version, "by", stored.Author)
	return &pb.PutEnvoyDomainResponse{Domain: envoyDomainPB(stored)}, nil
}

// GetEnvoyDomain implements pb.AdminServiceServer.
func (s *adminService) GetEnvoyDomain(ctx context.Context, req *pb.GetEnvoyDomainRequest) (*pb.EnvoyDomain, error) {
	st, err := s.envoyStore()
	if err != nil {
		return nil, toError(err)
	}
	if req.GetLocal() {
		for _, d := range st.EnvoyDomains().Domains {
			if d.Name == req.GetDomain() {
				return envoyDomainPB(d), nil
			}
		}
		return nil, toError(failf(rule.ErrNotFound, "envoy domain %q not found on node %s", req.GetDomain(), s.n.data.ID()))
	}
	d, err := st.GetEnvoyDomain(ctx, req.GetDomain())
	if err != nil {
		var resp *pb.EnvoyDomain
		err = s.n.onLeader(ctx, envoyNotFound(err), func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.GetEnvoyDomain(ctx, req)
			return err
		})
		return resp, err
	}
	return envoyDomainPB(d), nil
}

// ListEnvoyDomains implements pb.AdminServiceServer.
func (s *adminService) ListEnvoyDomains(ctx context.Context, req *pb.ListEnvoyDomainsRequest) (*pb.ListEnvoyDomainsResponse, error) {
	st, err := s.envoyStore()
	if err != nil {
		return nil, toError(err)
	}
	var ds raftfsm.EnvoyDomains
	if req.GetLocal() {
		ds = st.EnvoyDomains()
	} else if ds, err = st.ListEnvoyDomains(ctx); err != nil {
		var resp *pb.ListEnvoyDomainsResponse
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.ListEnvoyDomains(ctx, req)
			return err
		})
		return resp, err
	}
	out := &pb.ListEnvoyDomainsResponse{Domains: make([]*pb.EnvoyDomain, len(ds.Domains))}
	for i, d := range ds.Domains {
		out.Domains[i] = envoyDomainPB(d)
	}
	return out, nil
}

// DeleteEnvoyDomain implements pb.AdminServiceServer.
func (s *adminService) DeleteEnvoyDomain(ctx context.Context, req *pb.DeleteEnvoyDomainRequest) (*pb.DeleteEnvoyDomainResponse, error) {
	st, err := s.envoyStore()
	if err != nil {
		return nil, toError(err)
	}
	if req.GetDomain() == "" {
		return nil, toError(failf(ErrBadRequest, "domain: must not be empty"))
	}
	if err := st.DeleteEnvoyDomain(raftfsm.WithAuthor(ctx, actor(ctx)), req.GetDomain(), req.ExpectedVersion); err != nil {
		err = s.n.onLeader(ctx, envoyNotFound(err), func(ctx context.Context, c pb.AdminServiceClient) error {
			_, err := c.DeleteEnvoyDomain(ctx, req)
			return err
		})
		if err != nil {
			return nil, err
		}
		return &pb.DeleteEnvoyDomainResponse{}, nil
	}
	s.n.log.Info("envoy domain deleted", "domain", req.GetDomain(), "by", actor(ctx))
	return &pb.DeleteEnvoyDomainResponse{}, nil
}
