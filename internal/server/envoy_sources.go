package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tokenserver/tokenserver/internal/envoyrls"
	"github.com/tokenserver/tokenserver/internal/envoyrls/xds"
	"github.com/tokenserver/tokenserver/internal/filewatch"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// The Envoy configuration's watched sources. Every node watches
// --envoy-config-dir (so that each can say whether its own copy is valid);
// the leader writes what it read through Raft as one sync entry of the
// "file:" origin. The xDS client runs on the leader only and writes each
// set as a sync of the "xds:" origin.

const (
	envoyFileOrigin = "file:"
	envoyXDSOrigin  = "xds:"
	// envoySyncEvery is how often the leader re-checks that the replicated
	// domains match its directory (a no-op when they do).
	envoySyncEvery = time.Second
	// envoySweepEvery is how often idle Envoy counters are evicted.
	envoySweepEvery = 10 * time.Second
)

// run drives the sources and the sweeper until the node stops.
func (e *envoy) run(done <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-done; cancel() }()
	if e.cfg.ConfigDir != "" && e.store != nil {
		w, err := filewatch.New(filewatch.Options{
			Paths:    []string{e.cfg.ConfigDir},
			Interval: e.cfg.PollInterval,
			Load:     func(filewatch.Content) error { e.loadDir(); return nil },
			OnError: func(err error) {
				e.setDirErr(err)
			},
		})
		if err != nil {
			e.setDirErr(err)
		} else {
			defer w.Close()
		}
	}
	var xdsCancel context.CancelFunc
	xdsDone := make(chan struct{})
	close(xdsDone)
	sync := time.NewTicker(envoySyncEvery)
	defer sync.Stop()
	sweep := time.NewTicker(envoySweepEvery)
	defer sweep.Stop()
	for {
		if e.store != nil {
			leader := e.store.IsLeader()
			if leader {
				e.syncDir(ctx)
			}
			if e.cfg.XDS.Enabled() {
				switch {
				case leader && xdsCancel == nil:
					var xctx context.Context
					xctx, xdsCancel = context.WithCancel(ctx)
					xdsDone = make(chan struct{})
					go e.runXDS(xctx, xdsDone)
				case !leader && xdsCancel != nil:
					xdsCancel()
					<-xdsDone
					xdsCancel = nil
				}
			}
		}
		select {
		case <-ctx.Done():
			if xdsCancel != nil {
				xdsCancel()
				<-xdsDone
			}
			return
		case <-sync.C:
		case <-e.kick:
		case <-sweep.C:
			e.n.buckets.SweepIdle(time.Now().UnixNano(), isEnvoyRule)
		}
	}
}

// loadDir reads --envoy-config-dir: a valid directory becomes the one to
// sync; a bad one keeps the previous one and is logged (and, before the
// first valid read, keeps the node from being ready).
func (e *envoy) loadDir() {
	cfg, err := envoyrls.LoadDir(e.cfg.ConfigDir)
	if err != nil {
		e.setDirErr(err)
		return
	}
	e.dirMu.Lock()
	first := !e.dirLoaded
	e.dirCfg, e.dirLoaded, e.dirErr = cfg, true, ""
	e.dirMu.Unlock()
	e.n.log.Info("envoy config dir loaded", "dir", e.cfg.ConfigDir, "domains", cfg.Len(), "first", first)
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

func (e *envoy) setDirErr(err error) {
	e.dirMu.Lock()
	e.dirErr = fmt.Sprintf("--envoy-config-dir %s does not load: %v", e.cfg.ConfigDir, err)
	loaded := e.dirLoaded
	e.dirMu.Unlock()
	if loaded {
		e.n.log.Error("envoy config dir does not load; the configuration in force stays", "dir", e.cfg.ConfigDir, "err", err)
	} else {
		e.n.log.Error("envoy config dir does not load; this node is not ready until it does", "dir", e.cfg.ConfigDir, "err", err)
	}
}

// syncDir writes the directory's domains through Raft (on the leader),
// unless the replicated ones already match.
func (e *envoy) syncDir(ctx context.Context) {
	e.dirMu.Lock()
	cfg, synced := e.dirCfg, e.dirSynced
	e.dirMu.Unlock()
	if cfg == nil || (cfg == synced && e.n.data.Ready()) {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := e.store.SyncEnvoyDomains(sctx, envoyFileOrigin, storeDomains(cfg, func(d *envoyrls.Domain) string { return envoyFileOrigin + d.Meta().Source }))
	if err != nil {
		e.n.log.Warn("could not write the envoy config dir through raft; retrying", "err", err)
		return
	}
	e.dirMu.Lock()
	e.dirSynced = cfg
	e.dirMu.Unlock()
	if n > 0 {
		e.n.log.Info("envoy config dir written", "dir", e.cfg.ConfigDir, "changed", n)
	}
}

// storeDomains lists a configuration's domains as the FSM stores them.
func storeDomains(cfg *envoyrls.Config, author func(*envoyrls.Domain) string) []raftfsm.EnvoyDomain {
	ds := cfg.Domains()
	out := make([]raftfsm.EnvoyDomain, len(ds))
	for i, d := range ds {
		out[i] = raftfsm.EnvoyDomain{Name: d.Name(), YAML: string(d.YAML()), Author: author(d), Source: d.Meta().Source}
	}
	return out
}

// runXDS runs the xDS client until ctx ends; each set is written through
// Raft. No leader, or a write that times out, is xds.ErrRetry.
func (e *envoy) runXDS(ctx context.Context, done chan struct{}) {
	defer close(done)
	c, err := xds.New(e.cfg.XDS, func(ctx context.Context, cfg *envoyrls.Config, version string) error {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := e.store.SyncEnvoyDomains(sctx, envoyXDSOrigin, storeDomains(cfg, func(*envoyrls.Domain) string { return envoyXDSOrigin + e.cfg.XDS.Server }))
		if err != nil {
			var le *rule.LeaderError
			if errors.Is(err, rule.ErrNoLeader) || errors.As(err, &le) || errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("write xds set %s: %w: %w", version, err, xds.ErrRetry)
			}
			return fmt.Errorf("write xds set %s: %w", version, err)
		}
		e.n.log.Info("envoy xds set written", "version", version, "domains", cfg.Len(), "changed", n)
		return nil
	}, e.n.log)
	if err != nil {
		e.n.log.Error("envoy xds client", "err", err)
		return
	}
	if err := c.Run(ctx); err != nil {
		e.n.log.Error("envoy xds client stopped", "err", err)
	}
}
