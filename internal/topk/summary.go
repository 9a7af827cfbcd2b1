package topk

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// ErrInvalidSummary is wrapped by Summary.Validate for a summary that breaks
// the invariants Merge relies on (one from a broken or hostile peer).
var ErrInvalidSummary = errors.New("invalid top-keys summary")

// Entry is one key's count. Its true count lies in [Count-Error, Count]:
// Count never underestimates, and Error is 0 for a key counted exactly.
type Entry struct {
	// Key is the rule's key (a user, tenant, IP, API key).
	Key string
	// Count is an upper bound on the permits the key was observed with.
	Count int64
	// Error bounds the overestimate: the true count is at least
	// Count-Error.
	Error int64
}

// Summary is the serializable form of a sketch: one window and one side
// (admitted or denied) of one node, or several merged. It is a plain value:
// the server converts it to and from its wire form.
//
// Invariants (checked by Validate): each key appears once; for each entry
// 0 ≤ Error ≤ Floor and Error ≤ Count ≤ Total; every key not listed has a
// true count ≤ Floor; Floor ≤ Total. Entries from Snapshot, Merge and
// Truncate are sorted hottest first (Count descending, then Key).
type Summary struct {
	// Entries are the monitored keys.
	Entries []Entry
	// Floor bounds the true count of every key not in Entries, and the
	// Error of every entry. For one Space-Saving sketch it is the smallest
	// count once full, at most Total/capacity.
	Floor int64
	// Total is the sum of permits observed, listed keys or not.
	Total int64
}

// Validate checks the invariants of s and returns an error wrapping
// ErrInvalidSummary that names the first one broken.
func (s Summary) Validate() error {
	if s.Floor < 0 || s.Floor > s.Total {
		return fmt.Errorf("%w: floor %d outside [0, total %d]", ErrInvalidSummary, s.Floor, s.Total)
	}
	seen := make(map[string]struct{}, len(s.Entries))
	for _, e := range s.Entries {
		if _, dup := seen[e.Key]; dup {
			return fmt.Errorf("%w: key %q listed twice", ErrInvalidSummary, e.Key)
		}
		seen[e.Key] = struct{}{}
		if e.Error < 0 || e.Error > s.Floor || e.Count < e.Error || e.Count > s.Total {
			return fmt.Errorf("%w: key %q: count %d, error %d with floor %d, total %d",
				ErrInvalidSummary, e.Key, e.Count, e.Error, s.Floor, s.Total)
		}
	}
	return nil
}

// Merge combines summaries of disjoint streams (time buckets, nodes) into
// one summary of their union, as in the mergeable summaries of Agarwal et
// al. (2012). A key missing from an input may still have counted up to
// that input's Floor there, so it is charged that Floor in both Count and
// Error. Hence every merged Error is at most the sum of the inputs' Floors
// (their minimum counts), which is the merged Floor; for inputs straight
// from sketches of capacity k that sum is at most Total/k. Merge keeps
// every key of every input (at most the sum of their lengths); Truncate
// bounds the size. Inputs must be valid (Validate) and are not modified.
func Merge(inputs ...Summary) Summary {
	type acc struct {
		count, err, covered int64 // covered: the Floors of the inputs listing the key
	}
	var out Summary
	n := 0
	for _, in := range inputs {
		out.Floor += in.Floor
		out.Total += in.Total
		n += len(in.Entries)
	}
	byKey := make(map[string]*acc, n)
	keys := make([]string, 0, n)
	for _, in := range inputs {
		for _, e := range in.Entries {
			a := byKey[e.Key]
			if a == nil {
				a = &acc{}
				byKey[e.Key] = a
				keys = append(keys, e.Key)
			}
			a.count += e.Count
			a.err += e.Error
			a.covered += in.Floor
		}
	}
	if len(keys) > 0 {
		out.Entries = make([]Entry, len(keys))
		for i, k := range keys {
			a := byKey[k]
			missing := out.Floor - a.covered
			out.Entries[i] = Entry{Key: k, Count: a.count + missing, Error: a.err + missing}
		}
	}
	sortEntries(out.Entries)
	return out
}

// Truncate returns s with at most k entries, the k with the largest
// Counts. The Floor rises to the largest Count dropped, so every key not
// listed still has a true count ≤ Floor. k ≤ 0 keeps every entry.
func (s Summary) Truncate(k int) Summary {
	if k <= 0 || len(s.Entries) <= k {
		return s
	}
	e := slices.Clone(s.Entries)
	sortEntries(e)
	s.Floor = max(s.Floor, e[k].Count)
	s.Entries = e[:k:k]
	return s
}

// Top returns the n entries with the largest Counts, hottest first, as a
// new slice. n ≤ 0 returns every entry.
func (s Summary) Top(n int) []Entry {
	e := slices.Clone(s.Entries)
	sortEntries(e)
	if n > 0 && len(e) > n {
		e = e[:n:n]
	}
	return e
}

func sortEntries(e []Entry) {
	slices.SortFunc(e, func(a, b Entry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
}
