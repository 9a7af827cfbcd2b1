package raftfsm

import (
	"errors"
	"fmt"

	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// Request ids: a rule write may carry an idempotency key. A write answered
// "unavailable" may still have committed (the leader lost its lease after
// proposing it); its retry carries the same id and gets the first apply's
// result instead of, say, a compare-and-set failure against its own write.
// The FSM remembers the most recent maxRequests ids, in snapshots too, so
// that every replica answers a retry alike.

const (
	// maxRequests is how many request ids the FSM remembers (about 100
	// bytes each): the oldest is forgotten first.
	maxRequests = 10_000
	// MaxRequestIDLen is the longest request id, in bytes.
	MaxRequestIDLen = 128
)

// errKind numbers the errors a remembered write can have had: they are
// frozen in snapshots (RequestRecord.error), so numbers are never reused.
type errKind uint32

const (
	errNone errKind = iota
	errOther
	errVersionMismatch
	errTooManyRules
	errNotFound
	errInvalid
)

var kindSentinels = map[errKind]error{
	errVersionMismatch: rule.ErrVersionMismatch,
	errTooManyRules:    rule.ErrTooManyRules,
	errNotFound:        rule.ErrNotFound,
	errInvalid:         rule.ErrInvalid,
}

func kindOf(err error) errKind {
	if err == nil {
		return errNone
	}
	for k, s := range kindSentinels {
		if errors.Is(err, s) {
			return k
		}
	}
	return errOther
}

// recordedError is a remembered write's error: its message, and the
// sentinel of its kind for errors.Is.
type recordedError struct {
	msg  string
	kind errKind
}

func (e *recordedError) Error() string { return e.msg }
func (e *recordedError) Is(target error) bool {
	s, ok := kindSentinels[e.kind]
	return ok && target == s
}

// requestRecord is a remembered write's result.
type requestRecord struct {
	ID                  string
	Index               uint64
	Version, Generation uint64
	Err                 errKind
	Msg                 string
}

func recordOf(id string, index uint64, res applyResult) requestRecord {
	r := requestRecord{ID: id, Index: index, Err: kindOf(res.err)}
	if res.err != nil {
		r.Msg = res.err.Error()
	}
	if res.rule != nil {
		r.Version, r.Generation = res.rule.Version, res.rule.Generation
	}
	return r
}

// result is the remembered answer; a put's rule is the retried entry's
// rule (the same request) with the stored version and generation.
func (r requestRecord) result(put *rule.Rule) applyResult {
	if r.Err != errNone {
		return applyResult{err: &recordedError{msg: r.Msg, kind: r.Err}}
	}
	if put == nil {
		return applyResult{}
	}
	c := put.Clone()
	c.Version, c.Generation = r.Version, r.Generation
	return applyResult{rule: c}
}

// requestLog is the remembered request ids, oldest first. Like the rule
// set, only the FSM's goroutine reads or writes it, in place; Snapshot
// copies it.
type requestLog struct {
	byID  map[string]requestRecord
	order []string
}

func newRequestLog() *requestLog { return &requestLog{byID: map[string]requestRecord{}} }

func (l *requestLog) get(id string) (requestRecord, bool) {
	r, ok := l.byID[id]
	return r, ok
}

// add remembers r, forgetting the oldest past maxRequests.
func (l *requestLog) add(r requestRecord) {
	if _, dup := l.byID[r.ID]; dup {
		return
	}
	l.byID[r.ID] = r
	l.order = append(l.order, r.ID)
	if len(l.order) > maxRequests {
		delete(l.byID, l.order[0])
		copy(l.order, l.order[1:])
		l.order = l.order[:len(l.order)-1]
	}
}

func (l *requestLog) len() int { return len(l.order) }

func (l *requestLog) clone() *requestLog {
	c := &requestLog{byID: make(map[string]requestRecord, len(l.byID)), order: append([]string(nil), l.order...)}
	for k, v := range l.byID {
		c.byID[k] = v
	}
	return c
}

func (l *requestLog) toPB() []*raftv1.RequestRecord {
	out := make([]*raftv1.RequestRecord, 0, len(l.order))
	for _, id := range l.order {
		r := l.byID[id]
		out = append(out, &raftv1.RequestRecord{Id: r.ID, Index: r.Index, Version: r.Version, Generation: r.Generation,
			Error: uint32(r.Err), ErrorMessage: r.Msg})
	}
	return out
}

func requestLogFromPB(rs []*raftv1.RequestRecord) (*requestLog, error) {
	l := newRequestLog()
	for _, m := range rs {
		if m.GetId() == "" {
			return nil, errors.New("a request record without an id")
		}
		if _, dup := l.byID[m.GetId()]; dup {
			return nil, fmt.Errorf("request %q twice", m.GetId())
		}
		l.add(requestRecord{ID: m.GetId(), Index: m.GetIndex(), Version: m.GetVersion(), Generation: m.GetGeneration(),
			Err: errKind(m.GetError()), Msg: m.GetErrorMessage()})
	}
	return l, nil
}

// validRequestID checks a request id where the write enters the cluster.
func validRequestID(id string) error {
	if len(id) > MaxRequestIDLen {
		return rule.Invalid("request_id is %d bytes, above the limit of %d", len(id), MaxRequestIDLen)
	}
	return nil
}
