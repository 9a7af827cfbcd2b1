package server

import (
	"errors"
	"fmt"
	"net"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
)

// Listeners are the sockets a Node serves on. GRPC is required; HTTP
// (metrics, health) and Pprof are served when set.
type Listeners struct {
	GRPC  net.Listener
	HTTP  net.Listener
	Pprof net.Listener
}

// Close closes every listener that is set.
func (l Listeners) Close() error {
	var errs []error
	for _, x := range []net.Listener{l.GRPC, l.HTTP, l.Pprof} {
		if x != nil {
			errs = append(errs, x.Close())
		}
	}
	return errors.Join(errs...)
}

// Listen opens the listeners cfg names: GRPCAddr, HTTPAddr when set, and
// PprofAddr when Pprof is on (":0" picks a free port).
func Listen(cfg Config) (Listeners, error) {
	var l Listeners
	var err error
	if l.GRPC, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return Listeners{}, fmt.Errorf("listen grpc %s: %w", cfg.GRPCAddr, err)
	}
	if cfg.HTTPAddr != "" {
		if l.HTTP, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			l.Close()
			return Listeners{}, fmt.Errorf("listen http %s: %w", cfg.HTTPAddr, err)
		}
	}
	if cfg.Pprof && cfg.PprofAddr != "" {
		if l.Pprof, err = net.Listen("tcp", cfg.PprofAddr); err != nil {
			l.Close()
			return Listeners{}, fmt.Errorf("listen pprof %s: %w", cfg.PprofAddr, err)
		}
	}
	return l, nil
}

// Options configure Start.
type Options struct {
	// Server configures the gRPC and HTTP side.
	Server Config
	// Raft configures the Raft node; OpenRaft fills in its peer TLS,
	// AdvertiseGRPC, hooks and Join.
	Raft raftfsm.Config
	// Join lists gRPC addresses of members to ask to add this node.
	Join []string
}

// Start is the one way in three steps, in the order ":0" addresses need:
// it checks the peer security (before any port opens), opens the
// listeners (so that the advertised gRPC address is known before Raft
// records it), opens the Raft node (OpenRaft) and builds the node (New).
// Serve the node on the listeners it returns.
func Start(o Options) (*Node, Listeners, error) {
	multi := o.Raft.BootstrapExpect > 1 || len(o.Join) > 0 || len(o.Raft.Peers) > 1
	if err := CheckPeers(&o.Server.Security, multi, o.Raft.RaftBind); err != nil {
		return nil, Listeners{}, err
	}
	if err := CheckPeerCert(&o.Server.Security, o.Raft.NodeID); err != nil {
		return nil, Listeners{}, err
	}
	lis, err := Listen(o.Server)
	if err != nil {
		return nil, Listeners{}, err
	}
	if o.Server.AdvertiseGRPC == "" {
		o.Server.AdvertiseGRPC = lis.GRPC.Addr().String()
	}
	deps, err := OpenRaft(o.Server, o.Raft, o.Join)
	if err != nil {
		lis.Close()
		return nil, Listeners{}, err
	}
	n, err := New(o.Server, deps)
	if err != nil {
		deps.Control.Close()
		deps.Peers.close()
		lis.Close()
		return nil, Listeners{}, err
	}
	return n, lis, nil
}
