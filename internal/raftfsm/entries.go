package raftfsm

import (
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// Log entry types: the first byte of every entry, which picks its row in
// commands. Types 1-7 are the JSON entries of the first release (v0),
// kept so that a log written by it replays; this release proposes the
// protobuf entries 0x11-0x17 (messages of tokenserver.raft.v1). A type
// with ignoreUnknown set may be skipped by a node that does not know it;
// any other unknown type stops the node, since applying less than the
// others would let replicas diverge. Type bytes are never reused.
const (
	entryPutRuleV0      byte = 1
	entryDeleteRuleV0   byte = 2
	entrySetMemberV0    byte = 3
	entryRemoveMemberV0 byte = 4
	entrySetViewV0      byte = 5
	entryRestoreRulesV0 byte = 6
	entryDrainMemberV0  byte = 7

	entryPutRule      byte = 0x11 // raftv1.PutRule
	entryDeleteRule   byte = 0x12 // raftv1.DeleteRule
	entrySetMember    byte = 0x13 // raftv1.MemberChange
	entryRemoveMember byte = 0x14 // raftv1.MemberChange, id only
	entrySetView      byte = 0x15 // raftv1.SetView
	entryRestoreRules byte = 0x16 // raftv1.RestoreRules
	entryDrainMember  byte = 0x17 // raftv1.MemberChange, id only

	ignoreUnknown byte = 0x80
)

// The decoded entries: what a handler applies, whichever format the entry
// came in. Each holds values of its own (a rule in one belongs to it).
type (
	putRule struct {
		rule          *rule.Rule
		expected      *uint64
		maxRules      int
		maxTableBytes int64
		requestID     string
		meta          writeMeta
	}
	deleteRule struct {
		name      string
		expected  *uint64
		requestID string
		meta      writeMeta
	}
	setMember    struct{ member memberInfo }
	removeMember struct{ id string }
	drainMember  struct{ id string }
	setView      struct{ live []string }
	restoreRules struct {
		rules []*rule.Rule
		meta  writeMeta
	}
)

// applyFn applies one decoded entry to s at index.
type applyFn func(s *fsmState, index uint64) (applyResult, ruleChange)

// command is one row of the dispatch table: how one entry type decodes.
// Its decode returns the entry bound to its handler.
type command struct {
	name   string
	decode func(payload []byte) (applyFn, error)
}

// row makes a table row from a decoder and a handler: the decoder only
// decodes (and checks the structure the handler needs), the handler only
// applies.
func row[E any](name string, decode func([]byte) (E, error), apply func(*fsmState, uint64, E) (applyResult, ruleChange)) command {
	return command{name: name, decode: func(p []byte) (applyFn, error) {
		e, err := decode(p)
		if err != nil {
			return nil, fmt.Errorf("%s entry: %w", name, err)
		}
		return func(s *fsmState, index uint64) (applyResult, ruleChange) { return apply(s, index, e) }, nil
	}}
}

// commands is the dispatch table from entry type to decoder and handler.
// Adding an entry type is one row here, a decoder, and a handler method
// on fsmState (see the package doc). It is never written after init.
var commands = [...]command{
	entryPutRuleV0:      row("put rule (v0)", decodePutRuleV0, (*fsmState).putRule),
	entryDeleteRuleV0:   row("delete rule (v0)", decodeDeleteRuleV0, (*fsmState).deleteRule),
	entrySetMemberV0:    row("set member (v0)", decodeSetMemberV0, (*fsmState).setMember),
	entryRemoveMemberV0: row("remove member (v0)", decodeRemoveMemberV0, (*fsmState).removeMember),
	entrySetViewV0:      row("view (v0)", decodeSetViewV0, (*fsmState).setView),
	entryRestoreRulesV0: row("restore (v0)", decodeRestoreRulesV0, (*fsmState).restoreRules),
	entryDrainMemberV0:  row("drain member (v0)", decodeDrainMemberV0, (*fsmState).drainMember),

	entryPutRule:      row("put rule", decodePutRule, (*fsmState).putRule),
	entryDeleteRule:   row("delete rule", decodeDeleteRule, (*fsmState).deleteRule),
	entrySetMember:    row("set member", decodeSetMember, (*fsmState).setMember),
	entryRemoveMember: row("remove member", decodeRemoveMember, (*fsmState).removeMember),
	entrySetView:      row("view", decodeSetView, (*fsmState).setView),
	entryRestoreRules: row("restore", decodeRestoreRules, (*fsmState).restoreRules),
	entryDrainMember:  row("drain member", decodeDrainMember, (*fsmState).drainMember),

	entryPutEnvoyDomain:    row("put envoy domain", decodePutEnvoyDomain, (*fsmState).putEnvoyDomain),
	entryDeleteEnvoyDomain: row("delete envoy domain", decodeDeleteEnvoyDomain, (*fsmState).deleteEnvoyDomain),
	entrySyncEnvoyDomains:  row("sync envoy domains", decodeSyncEnvoyDomains, (*fsmState).syncEnvoyDomains),
	entryPutOverride:       row("put override", decodePutOverride, (*fsmState).putOverride),
	entryDeleteOverrides:   row("delete overrides", decodeDeleteOverrides, (*fsmState).deleteOverrides),
}

// errUnknownEntry is an entry type this node does not know.
var errUnknownEntry = errors.New("unknown log entry type: this node is older than the cluster; upgrade it")

// decodeEntry decodes a command entry into its handler, bound to the
// entry. An unknown type with ignoreUnknown set decodes to a nil handler;
// any other unknown type is errUnknownEntry.
func decodeEntry(data []byte) (byte, applyFn, error) {
	if len(data) == 0 {
		return 0, nil, errors.New("empty entry")
	}
	t := data[0]
	if int(t) < len(commands) && commands[t].decode != nil {
		fn, err := commands[t].decode(data[1:])
		return t, fn, err
	}
	if t&ignoreUnknown != 0 {
		return t, nil, nil
	}
	return t, nil, fmt.Errorf("type %d: %w", t, errUnknownEntry)
}

// encodeEntry makes a log entry of a type byte and a message.
func encodeEntry(t byte, m proto.Message) ([]byte, error) {
	b := make([]byte, 1, 1+proto.Size(m))
	b[0] = t
	b, err := proto.MarshalOptions{}.MarshalAppend(b, m)
	if err != nil {
		return nil, fmt.Errorf("encode entry %d: %w", t, err)
	}
	return b, nil
}

// Decoders of the protobuf entries.

func decodePutRule(p []byte) (putRule, error) {
	var m raftv1.PutRule
	if err := proto.Unmarshal(p, &m); err != nil {
		return putRule{}, err
	}
	if m.Rule == nil {
		return putRule{}, errors.New("no rule")
	}
	return putRule{rule: ruleFromPB(m.Rule), expected: copyU64(m.ExpectedVersion), maxRules: clampInt(m.MaxRules),
		maxTableBytes: m.MaxTableBytes, requestID: m.RequestId,
		meta: writeMeta{principal: m.Rule.UpdatedBy, timeNs: m.TimeUnixNs, change: m.Change, rollbackTo: m.RollbackTo}}, nil
}

func decodeDeleteRule(p []byte) (deleteRule, error) {
	var m raftv1.DeleteRule
	if err := proto.Unmarshal(p, &m); err != nil {
		return deleteRule{}, err
	}
	return deleteRule{name: m.Name, expected: copyU64(m.ExpectedVersion), requestID: m.RequestId,
		meta: writeMeta{principal: m.Principal, timeNs: m.TimeUnixNs}}, nil
}

func decodeMemberChange(p []byte) (memberInfo, error) {
	var m raftv1.MemberChange
	if err := proto.Unmarshal(p, &m); err != nil {
		return memberInfo{}, err
	}
	if m.Member.GetId() == "" {
		return memberInfo{}, errors.New("no member id")
	}
	return memberFromPB(m.Member), nil
}

func decodeSetMember(p []byte) (setMember, error) {
	m, err := decodeMemberChange(p)
	return setMember{m}, err
}

func decodeRemoveMember(p []byte) (removeMember, error) {
	m, err := decodeMemberChange(p)
	return removeMember{m.ID}, err
}

func decodeDrainMember(p []byte) (drainMember, error) {
	m, err := decodeMemberChange(p)
	return drainMember{m.ID}, err
}

func decodeSetView(p []byte) (setView, error) {
	var m raftv1.SetView
	if err := proto.Unmarshal(p, &m); err != nil {
		return setView{}, err
	}
	return setView{live: m.Live}, nil
}

func decodeRestoreRules(p []byte) (restoreRules, error) {
	var m raftv1.RestoreRules
	if err := proto.Unmarshal(p, &m); err != nil {
		return restoreRules{}, err
	}
	e := restoreRules{rules: make([]*rule.Rule, len(m.Rules)), meta: writeMeta{principal: m.Principal, timeNs: m.TimeUnixNs}}
	for i, r := range m.Rules {
		if r != nil {
			e.rules[i] = ruleFromPB(r)
		}
	}
	return e, nil
}

func copyU64(p *uint64) *uint64 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// clampInt reads an int64 count as an int.
func clampInt(v int64) int {
	if v > math.MaxInt {
		return math.MaxInt
	}
	return int(v)
}

// clamp8 reads an enum number into a uint8 enum; numbers past it become
// 255, which no release gives a meaning.
func clamp8(v uint32) uint8 {
	if v > math.MaxUint8 {
		return math.MaxUint8
	}
	return uint8(v)
}

// ruleToPB is r in the frozen format.
func ruleToPB(r *rule.Rule) *raftv1.Rule {
	m := &raftv1.Rule{
		Name: r.Name, Algorithm: uint32(r.Algorithm), Limit: r.Limit, PeriodNs: int64(r.Period),
		Burst: r.Burst, SampleCount: r.SampleCount, WarmupNs: int64(r.Warmup), PenaltyNs: int64(r.Penalty),
		MaxKeys: r.MaxKeys, Deny: r.Deny, Allow: r.Allow, Shadow: r.Shadow,
		FallbackPolicy: uint32(r.Fallback.Policy), FallbackLimit: r.Fallback.Limit,
		LeaseMaxBatch: r.Lease.MaxBatch, LeaseTtlNs: int64(r.Lease.TTL),
		Version: r.Version, Generation: r.Generation, UpdatedBy: r.UpdatedBy,
		Calendar: uint32(r.Calendar), TimeZone: r.TimeZone,
		InlineMaxLimit: r.Inline.MaxLimit, InlineMaxPeriodNs: int64(r.Inline.MaxPeriod),
		ReservationTtlNs: int64(r.ReservationTTL), Durable: r.Durable,
	}
	if len(r.Overrides) > 0 {
		m.Overrides = make([]*raftv1.Override, len(r.Overrides))
		for i, o := range r.Overrides {
			m.Overrides[i] = &raftv1.Override{Key: o.Key, Limit: o.Limit, Burst: o.Burst}
		}
	}
	return m
}

// ruleFromPB reads a rule of the frozen format (a new value: the message
// is not kept).
func ruleFromPB(m *raftv1.Rule) *rule.Rule {
	r := &rule.Rule{
		Name: m.Name, Algorithm: bucket.Algorithm(clamp8(m.Algorithm)), Limit: m.Limit, Period: time.Duration(m.PeriodNs),
		Burst: m.Burst, SampleCount: m.SampleCount, Warmup: time.Duration(m.WarmupNs), Penalty: time.Duration(m.PenaltyNs),
		MaxKeys: m.MaxKeys, Deny: m.Deny, Allow: m.Allow, Shadow: m.Shadow,
		Fallback: rule.Fallback{Policy: rule.FallbackPolicy(clamp8(m.FallbackPolicy)), Limit: m.FallbackLimit},
		Lease:    rule.Lease{MaxBatch: m.LeaseMaxBatch, TTL: time.Duration(m.LeaseTtlNs)},
		Version:  m.Version, Generation: m.Generation, UpdatedBy: m.UpdatedBy,
		Calendar: bucket.Calendar(clamp8(m.Calendar)), TimeZone: m.TimeZone,
		Inline:         rule.InlinePolicy{MaxLimit: m.InlineMaxLimit, MaxPeriod: time.Duration(m.InlineMaxPeriodNs)},
		ReservationTTL: time.Duration(m.ReservationTtlNs), Durable: m.Durable,
	}
	if len(m.Overrides) > 0 {
		r.Overrides = make([]rule.Override, len(m.Overrides))
		for i, o := range m.Overrides {
			r.Overrides[i] = rule.Override{Key: o.GetKey(), Limit: o.GetLimit(), Burst: o.GetBurst()}
		}
	}
	return r
}

func memberToPB(m memberInfo) *raftv1.Member {
	return &raftv1.Member{Id: m.ID, GrpcAddr: m.GRPCAddr, RaftAddr: m.RaftAddr, WasLive: m.WasLive, Draining: m.Draining}
}

func memberFromPB(m *raftv1.Member) memberInfo {
	return memberInfo{ID: m.GetId(), GRPCAddr: m.GetGrpcAddr(), RaftAddr: m.GetRaftAddr(), WasLive: m.GetWasLive(), Draining: m.GetDraining()}
}
