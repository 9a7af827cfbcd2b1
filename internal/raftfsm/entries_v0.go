package raftfsm

import (
	"encoding/json"
	"errors"
	"sort"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// The JSON formats of the first release (v0), frozen here so that a node
// upgraded from it replays its log and snapshots: nothing proposes them
// any more. They are their own Go types, so that renaming a field of
// rule.Rule cannot change what they decode to.

// ruleV0 is a rule as the first release wrote it in JSON.
type ruleV0 struct {
	Name        string        `json:"name,omitempty"`
	Algorithm   uint8         `json:"algorithm,omitempty"`
	Limit       int64         `json:"limit,omitempty"`
	Period      time.Duration `json:"period,omitempty"`
	Burst       int64         `json:"burst,omitempty"`
	SampleCount int64         `json:"sample_count,omitempty"`
	Warmup      time.Duration `json:"warmup,omitempty"`
	Penalty     time.Duration `json:"penalty,omitempty"`
	MaxKeys     int64         `json:"max_keys,omitempty"`
	Overrides   []struct {
		Key   string `json:"key"`
		Limit int64  `json:"limit"`
		Burst int64  `json:"burst,omitempty"`
	} `json:"overrides,omitempty"`
	Deny     []string `json:"deny,omitempty"`
	Allow    []string `json:"allow,omitempty"`
	Shadow   bool     `json:"shadow,omitempty"`
	Fallback struct {
		Policy uint8 `json:"policy,omitempty"`
		Limit  int64 `json:"limit,omitempty"`
	} `json:"fallback,omitempty"`
	Lease struct {
		MaxBatch int64         `json:"max_batch,omitempty"`
		TTL      time.Duration `json:"ttl,omitempty"`
	} `json:"lease,omitempty"`
	Version    uint64 `json:"version,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
	UpdatedBy  string `json:"updated_by,omitempty"`
}

// normalizeV0 is what the first release's apply did to every rule it
// stored (rule.Normalize as it was then): overrides sorted by key, deny
// and allow lists sorted without duplicates. A v0 entry proposed through
// the API was normalized already; one restored from a snapshot file might
// not be, so replay does it again, frozen here.
func normalizeV0(r *rule.Rule) {
	sort.Slice(r.Overrides, func(i, j int) bool { return r.Overrides[i].Key < r.Overrides[j].Key })
	r.Deny = sortedUniqueV0(r.Deny)
	r.Allow = sortedUniqueV0(r.Allow)
}

func sortedUniqueV0(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	sort.Strings(s)
	out := s[:1]
	for _, v := range s[1:] {
		if v != out[len(out)-1] {
			out = append(out, v)
		}
	}
	return out
}

// rule converts r; nil stays nil.
func (r *ruleV0) rule() *rule.Rule {
	if r == nil {
		return nil
	}
	out := &rule.Rule{
		Name: r.Name, Algorithm: bucket.Algorithm(r.Algorithm), Limit: r.Limit, Period: r.Period,
		Burst: r.Burst, SampleCount: r.SampleCount, Warmup: r.Warmup, Penalty: r.Penalty,
		MaxKeys: r.MaxKeys, Deny: r.Deny, Allow: r.Allow, Shadow: r.Shadow,
		Fallback: rule.Fallback{Policy: rule.FallbackPolicy(r.Fallback.Policy), Limit: r.Fallback.Limit},
		Lease:    rule.Lease{MaxBatch: r.Lease.MaxBatch, TTL: r.Lease.TTL},
		Version:  r.Version, Generation: r.Generation, UpdatedBy: r.UpdatedBy,
	}
	for _, o := range r.Overrides {
		out.Overrides = append(out.Overrides, rule.Override{Key: o.Key, Limit: o.Limit, Burst: o.Burst})
	}
	return out
}

// memberV0 is a member record of the first release.
type memberV0 struct {
	ID       string `json:"id"`
	GRPCAddr string `json:"grpc_addr"`
	RaftAddr string `json:"raft_addr"`
	WasLive  bool   `json:"was_live,omitempty"`
	Draining bool   `json:"draining,omitempty"`
}

func (m memberV0) info() memberInfo {
	return memberInfo(m)
}

// snapshotV0 is the first release's snapshot: JSON of its FSM state.
type snapshotV0 struct {
	Index     uint64              `json:"index"`
	Rules     map[string]*ruleV0  `json:"rules"`
	Members   map[string]memberV0 `json:"members"`
	Live      []string            `json:"live"`
	ViewEpoch uint64              `json:"view_epoch"`
}

func decodePutRuleV0(p []byte) (putRule, error) {
	var e struct {
		Rule     *ruleV0 `json:"rule"`
		Expected *uint64 `json:"expected,omitempty"`
		MaxRules int     `json:"max_rules,omitempty"`
	}
	if err := json.Unmarshal(p, &e); err != nil {
		return putRule{}, err
	}
	if e.Rule == nil {
		return putRule{}, errors.New("no rule")
	}
	r := e.Rule.rule()
	normalizeV0(r)
	return putRule{rule: r, expected: e.Expected, maxRules: e.MaxRules}, nil
}

func decodeDeleteRuleV0(p []byte) (deleteRule, error) {
	var e struct {
		Name     string  `json:"name"`
		Expected *uint64 `json:"expected,omitempty"`
	}
	if err := json.Unmarshal(p, &e); err != nil {
		return deleteRule{}, err
	}
	return deleteRule{name: e.Name, expected: e.Expected}, nil
}

func decodeMemberV0(p []byte) (memberInfo, error) {
	var e struct {
		Member memberV0 `json:"member"`
	}
	if err := json.Unmarshal(p, &e); err != nil {
		return memberInfo{}, err
	}
	if e.Member.ID == "" {
		return memberInfo{}, errors.New("no member id")
	}
	return e.Member.info(), nil
}

func decodeSetMemberV0(p []byte) (setMember, error) {
	m, err := decodeMemberV0(p)
	return setMember{m}, err
}

func decodeRemoveMemberV0(p []byte) (removeMember, error) {
	m, err := decodeMemberV0(p)
	return removeMember{m.ID}, err
}

func decodeDrainMemberV0(p []byte) (drainMember, error) {
	m, err := decodeMemberV0(p)
	return drainMember{m.ID}, err
}

func decodeSetViewV0(p []byte) (setView, error) {
	var e struct {
		Live []string `json:"live"`
	}
	if err := json.Unmarshal(p, &e); err != nil {
		return setView{}, err
	}
	return setView{live: e.Live}, nil
}

func decodeRestoreRulesV0(p []byte) (restoreRules, error) {
	var e struct {
		Rules []*ruleV0 `json:"rules"`
	}
	if err := json.Unmarshal(p, &e); err != nil {
		return restoreRules{}, err
	}
	out := restoreRules{rules: make([]*rule.Rule, len(e.Rules))}
	for i, r := range e.Rules {
		if out.rules[i] = r.rule(); out.rules[i] != nil {
			normalizeV0(out.rules[i])
		}
	}
	return out, nil
}
