// Package raftfsm replicates tokenserver's rules and routing view with
// hashicorp/raft: the FSM, the raft-boltdb log and stable stores, file
// snapshots, bootstrapping, membership and liveness; it implements
// rule.Store.
//
// # Entries and the dispatch table
//
// Every log entry is one type byte followed by a payload. The FSM looks the
// type up in commands (entries.go), consul's commands pattern: each row
// has a decoder, which only decodes and checks the structure its handler
// needs, and a handler, a method of fsmState that only applies. Nothing on
// the apply path validates: a write is normalized and validated once, at
// the edge, before it is proposed (Node.Put, Node.Delete,
// Node.RestoreRules, and the server before them). Apply keeps the checks
// the entry itself carries: the compare-and-set on a rule's version and
// the rule cap of the leader that proposed it. So what a log yields does
// not depend on the validation of the release that replays it, and
// replicas of different releases never diverge.
//
// The payloads are frozen protobuf messages of tokenserver.raft.v1
// (proto/tokenserver/raft/v1/entries.proto), like etcd's
// InternalRaftRequest: renaming a Go field cannot change what replays.
// The first release wrote JSON entries (types 1-7) and JSON snapshots;
// their decoders stay in entries_v0.go behind the same table, so a node
// upgraded from it replays its own data. Snapshots start with "TSS" and a
// format version (snapformat.go). testdata/golden pins a log and a
// snapshot of each format and the state they must yield.
//
// An unknown entry type stops the node (a panic raft does not catch)
// rather than let it apply less than the others, unless its type has
// ignoreUnknown (0x80) set.
//
// # Adding an entry type
//
// A new kind of replicated state (overrides, Envoy domains, rule history,
// durable buckets) comes in through the same table:
//
//  1. a message in entries.proto (and its part of the Snapshot message),
//     then `make proto`;
//  2. a new type byte, never one used before; set ignoreUnknown if older
//     nodes may skip it safely;
//  3. a decoder func([]byte) (E, error) and a handler
//     func (s *fsmState) x(index uint64, e E) (applyResult, ruleChange);
//  4. one row in commands: row("name", decoder, (*fsmState).x);
//  5. a golden entry for it in testdata/golden (see TestGolden).
//
// Proposers encode with encodeEntry(type, message) after validating.
//
// # Rule semantics
//
// Put, CAS, the cap, generations and versions (the Raft index) are
// rule.Set's, the one implementation; the FSM keeps its rules in a Set.
// NewInmem runs a real one-node Raft over raft's in-memory stores and
// transport, for tests of other packages that need a rule.Store.
//
// Hand-written here, and why: the stream layer (hashicorp/raft's TCP
// transport advertises only IP addresses; stream.go) and autopilot (the
// leader already health-checks every member; autopilot.go says more).
package raftfsm
