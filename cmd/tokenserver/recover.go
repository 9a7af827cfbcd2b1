package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
)

// runRecover is `tokenserver recover`: the offline recovery of a cluster
// that lost quorum (see raftfsm.Recover and docs/operations.md).
func runRecover(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tokenserver recover", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run and main print the error once
	host, _ := os.Hostname()
	dataDir := fs.String("data-dir", "./data", "the stopped node's data directory")
	nodeID := fs.String("node-id", host, "the stopped node's id (default: the host name)")
	peers := fs.String("peers", "", "the surviving members as id=host:raftport,... (this node included); they become the voters")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, `Usage: tokenserver recover --data-dir DIR --node-id ID --peers id=host:raftport,...

Rewrites the Raft configuration of a STOPPED node to the given survivors,
keeping every committed rule, after the cluster lost quorum for good (as
Consul's peers.json or etcd's --force-new-cluster). Then start the node as
before: it leads the survivors; other nodes join it with --join after their
data dirs are wiped. See docs/operations.md, "Recovering from lost quorum".

Flags:
`)
			printFlags(stdout, fs)
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("recover: unexpected argument %q (flags only; see --help)", fs.Arg(0))
	}
	ps, err := parsePeers(*peers)
	if err != nil {
		return err
	}
	if len(ps) == 0 {
		return errors.New("recover: --peers is required: the surviving members as id=host:raftport, comma-separated")
	}
	log, err := newLogger("text", *logLevel, stderr)
	if err != nil {
		return err
	}
	if err := raftfsm.Recover(*dataDir, *nodeID, ps, log); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "recovered %s: the voters are now %s; start the node as before\n", *dataDir, strings.TrimSpace(*peers))
	return nil
}

// parsePeers parses id=host:raftport,... (empty: none).
func parsePeers(s string) ([]raftfsm.Peer, error) {
	var out []raftfsm.Peer
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, p := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("--peers: %q is not id=host:raftport", p)
		}
		out = append(out, raftfsm.Peer{ID: id, RaftAddr: addr})
	}
	return out, nil
}
