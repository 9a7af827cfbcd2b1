package rule

import (
	"errors"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// TestSet: one step table for the rule-set semantics every store shares
// (the FSM applies entries through Set): versions are the write's index,
// generations survive puts of the same algorithm, the CAS and the cap.
func TestSet(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	tb := func(limit int64) *Rule {
		return &Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: limit, Period: time.Second}
	}
	fw := &Rule{Name: "api", Algorithm: bucket.FixedWindow, Limit: 20, Period: time.Second}
	other := func(name string) *Rule {
		return &Rule{Name: name, Algorithm: bucket.TokenBucket, Limit: 1, Period: time.Second}
	}
	type step struct {
		index    uint64
		put      *Rule // else delete del
		del      string
		expected *uint64
		maxRules int
		wantErr  error
		// After the step: the rule "api" at this version and generation
		// (0 0: none), and the set's size.
		version, generation uint64
		n                   int
	}
	steps := []step{
		{index: 1, put: tb(10), expected: u(0), version: 1, generation: 1, n: 1},
		{index: 2, put: tb(10), expected: u(0), wantErr: ErrVersionMismatch, version: 1, generation: 1, n: 1},
		{index: 3, put: tb(20), expected: u(1), version: 3, generation: 1, n: 1},
		{index: 4, put: fw, version: 4, generation: 4, n: 1},
		{index: 5, put: other("b"), maxRules: 2, version: 4, generation: 4, n: 2},
		{index: 6, put: other("c"), maxRules: 2, wantErr: ErrTooManyRules, version: 4, generation: 4, n: 2},
		{index: 7, put: tb(5), maxRules: 2, version: 7, generation: 7, n: 2}, // a change at the cap
		{index: 8, del: "api", expected: u(6), wantErr: ErrVersionMismatch, version: 7, generation: 7, n: 2},
		{index: 9, del: "api", expected: u(7), n: 1},
		{index: 10, del: "api", wantErr: ErrNotFound, n: 1},
		{index: 11, put: tb(10), version: 11, generation: 11, n: 2}, // re-created: a new generation
		{index: 12, put: &Rule{}, wantErr: ErrInvalid, version: 11, generation: 11, n: 2},
		{index: 13, put: &Rule{Name: "api", Limit: -5}, version: 13, generation: 13, n: 2}, // not validated
	}
	s := NewSet()
	for _, st := range steps {
		var err error
		if st.put != nil {
			err = s.Put(st.index, st.put.Clone(), st.expected, st.maxRules)
		} else {
			err = s.Delete(st.del, st.expected)
		}
		if !errors.Is(err, st.wantErr) || (err == nil) != (st.wantErr == nil) {
			t.Fatalf("step %d: error %v, want %v", st.index, err, st.wantErr)
		}
		var v, g uint64
		if r := s.Get("api"); r != nil {
			v, g = r.Version, r.Generation
		}
		if v != st.version || g != st.generation || s.Len() != st.n {
			t.Fatalf("step %d: api at version %d generation %d, %d rules; want %d %d, %d", st.index, v, g, s.Len(), st.version, st.generation, st.n)
		}
	}
}

func TestSetReplaceAndLoad(t *testing.T) {
	s := NewSet()
	if err := s.Put(1, &Rule{Name: "old"}, nil, 0); err != nil {
		t.Fatal(err)
	}
	c := s.Clone()
	if err := s.Replace(5, []*Rule{{Name: "a"}, {Name: "b"}}); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 2 || s.Get("old") != nil || s.Get("a").Version != 5 || s.Get("b").Generation != 5 {
		t.Fatalf("after replace: %v", s.All())
	}
	if c.Get("old") == nil || c.Len() != 1 {
		t.Fatal("a clone saw the replace")
	}
	if err := s.Replace(6, []*Rule{{Name: "x"}, nil}); !errors.Is(err, ErrInvalid) || s.Len() != 2 {
		t.Fatalf("replace with a nil rule: %v, %d rules", err, s.Len())
	}
	if err := s.Load([]*Rule{{Name: "x", Version: 3, Generation: 2}}); err != nil || s.Get("x").Version != 3 || s.Get("x").Generation != 2 {
		t.Fatalf("load: %v %+v", err, s.Get("x"))
	}
	if err := s.Load([]*Rule{{Name: "x"}, {Name: "x"}}); !errors.Is(err, ErrInvalid) || s.Get("x").Version != 3 {
		t.Fatalf("load of a duplicate: %v", err)
	}
}
