package bucket

import "fmt"

// debtor is a bucket that takes commits: charge adds n permits even past
// what it holds, and owed answers for the state at now.
type debtor interface {
	Refill(c *Config, now int64, g Grant, permits int64) int64
	charge(c *Config, now, n int64)
	owed(c *Config, now int64) CommitResult
}

// commit is Bucket.Commit for the algorithms that take commits.
func commit(b debtor, c *Config, now int64, g Grant, used int64) (CommitResult, error) {
	if used < 0 {
		return CommitResult{}, fmt.Errorf("commit of %d permits: %w", used, ErrNegativeUsage)
	}
	var returned, debited int64
	switch {
	case used < g.Permits:
		returned = b.Refill(c, now, g, g.Permits-used)
	case used > g.Permits:
		debited = used - max(g.Permits, 0)
		b.charge(c, now, debited)
	}
	res := b.owed(c, now)
	res.Returned, res.Debited = returned, debited
	return res, nil
}

// debit is Bucket.Debit for the algorithms that take commits.
func debit(b debtor, c *Config, now, n int64) (CommitResult, error) {
	if n < 0 {
		return CommitResult{}, fmt.Errorf("debit of %d permits: %w", n, ErrNegativeUsage)
	}
	if n > 0 {
		b.charge(c, now, n)
	}
	res := b.owed(c, now)
	res.Debited = n
	return res, nil
}

// noCommit is Bucket.Commit and Bucket.Debit for the algorithms that take
// none.
func noCommit(a Algorithm) (CommitResult, error) {
	return CommitResult{}, fmt.Errorf("%s: %w", a, ErrNoCommit)
}
