package raftfsm

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"

	"github.com/hashicorp/raft"
)

// Recover rewrites the Raft configuration of the stopped node nodeID in
// dataDir to peers (the survivors, all voters), keeping every committed
// entry: the offline recovery of a cluster that lost quorum, as Consul's
// peers.json or etcd's --force-new-cluster. Run it on one survivor, start
// it, and let the others rejoin it with --join after wiping their data
// dirs. Entries the lost quorum never committed may be dropped or, if this
// node holds them, committed now: the survivor with the longest log is the
// one to recover.
func Recover(dataDir, nodeID string, peers []Peer, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	switch {
	case dataDir == "":
		return fmt.Errorf("recover: the data dir is empty")
	case len(peers) == 0:
		return fmt.Errorf("recover: no peers given")
	case !slices.ContainsFunc(peers, func(p Peer) bool { return p.ID == nodeID }):
		return fmt.Errorf("recover: the peers do not list this node's id %q", nodeID)
	}
	if err := CheckDataDir(dataDir); err != nil {
		return err
	}
	bolt, err := openBolt(dataDir, false)
	if err != nil {
		return err
	}
	defer bolt.Close()
	hl := newHCLogger(logger, "raft")
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dataDir, 3, hl)
	if err != nil {
		return fmt.Errorf("recover: open snapshots: %w", err)
	}
	has, err := raft.HasExistingState(bolt, bolt, snaps)
	if err != nil {
		return fmt.Errorf("recover: read raft state: %w", err)
	}
	if !has {
		return fmt.Errorf("recover: %s holds no raft state: nothing to recover", dataDir)
	}
	var conf raft.Configuration
	sorted := append([]Peer(nil), peers...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].ID < sorted[j].ID })
	for _, p := range sorted {
		conf.Servers = append(conf.Servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr), Suffrage: raft.Voter})
	}
	cfg := DefaultConfig()
	cfg.NodeID = nodeID
	_, trans := raft.NewInmemTransport("")
	if err := raft.RecoverCluster(cfg.raftConfig(hl), NewFSM(), bolt, bolt, snaps, trans, conf); err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	logger.Info("raft configuration recovered", "data_dir", dataDir, "voters", len(conf.Servers))
	return nil
}
