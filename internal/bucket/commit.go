package bucket

import "fmt"

// split validates a commit of used permits against grant g and returns
// what goes back and what is charged beyond the reservation. Each
// algorithm's Commit calls it and then its own refill, charge and owed
// directly: going through an interface cost a leaky bucket half again the
// time of Refill and a peek.
func split(g Grant, used int64) (giveBack, charge int64, err error) {
	if used < 0 {
		return 0, 0, negativeUsage("commit", used)
	}
	if d := used - max(g.Permits, 0); d > 0 {
		return 0, d, nil
	}
	return g.Permits - used, 0, nil
}

// negativeUsage is the error of a commit or debit below zero, kept out of
// line so that split inlines.
//
//go:noinline
func negativeUsage(what string, n int64) error {
	return fmt.Errorf("%s of %d permits: %w", what, n, ErrNegativeUsage)
}

// noCommit is Bucket.Commit and Bucket.Debit for the algorithms that take
// none.
func noCommit(a Algorithm) (CommitResult, error) {
	return CommitResult{}, fmt.Errorf("%s: %w", a, ErrNoCommit)
}
