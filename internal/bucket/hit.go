package bucket

import "errors"

// ErrNoHit means Hit was asked of a bucket that is not a fixed window with
// epoch windows (Config.Calendar unset).
var ErrNoHit = errors.New("hit counts on fixed-window buckets only")

// HitResult is what Hit did to a fixed window.
type HitResult struct {
	// Before and After are the window's count before and after the hit.
	Before, After int64
	// ResetAfter is the time until the window ends.
	ResetAfter int64
}

// Hit counts n >= 0 permits on a fixed-window bucket b without judging
// them: as Redis INCRBY on envoyproxy/ratelimit's window key, every hit is
// counted even past c.Limit (the caller judges After against its own
// limit), and the count is forgotten at the window boundary: a count above
// the limit is not debt and is never carried into the next window. n = 0
// reads the count. It returns ErrNoHit, changing nothing, for any other
// bucket or a calendar window.
func Hit(b Bucket, c *Config, now int64, n int64) (HitResult, error) {
	f, ok := b.(*fixedWindow)
	if !ok || c.Calendar != CalendarNone || c.Algorithm != FixedWindow {
		return HitResult{}, ErrNoHit
	}
	now = f.advance(c, now)
	if f.count < 0 {
		// Debt from Commit or Debit: Hit shares no bucket with them, but
		// should one be passed, what it holds is the count.
		f.count = -f.count
	}
	before := f.count
	f.count = addSat(f.count, max(n, 0))
	return HitResult{Before: before, After: f.count, ResetAfter: f.end(c) - now}, nil
}
