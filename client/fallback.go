package client

import (
	"container/list"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// localLimiters are the fallback limiters, one per (rule, key), at most max
// of them, least recently used first out.
type localLimiters struct {
	mu  sync.Mutex
	max int
	lru *list.List // of *localLimiter, most recent first
	m   map[localKey]*list.Element
}

type localKey struct{ rule, key string }

// localLimiter throttles one (rule, key) while the server cannot answer: a
// rate limiter for rate rules, an in-flight count for concurrency rules.
type localLimiter struct {
	k        localKey
	limit    int64
	period   time.Duration
	lim      *rate.Limiter
	inflight int64 // concurrency handles held locally; guarded by localLimiters.mu
}

func newLocalLimiters(most int) *localLimiters {
	return &localLimiters{max: most, lru: list.New(), m: map[localKey]*list.Element{}}
}

// get returns the limiter of (rule, key) admitting limit per period,
// making a new one when there is none or its limit changed. Call with mu
// held.
func (ls *localLimiters) get(ruleName, key string, limit int64, period time.Duration) *localLimiter {
	k := localKey{ruleName, key}
	if e, ok := ls.m[k]; ok {
		l := e.Value.(*localLimiter)
		if l.limit == limit && l.period == period {
			ls.lru.MoveToFront(e)
			return l
		}
		ls.lru.Remove(e)
		delete(ls.m, k)
	}
	l := &localLimiter{k: k, limit: limit, period: period,
		lim: rate.NewLimiter(rate.Limit(float64(limit)/period.Seconds()), int(min(limit, 1<<30)))}
	ls.m[k] = ls.lru.PushFront(l)
	for ls.lru.Len() > ls.max {
		old := ls.lru.Back()
		ls.lru.Remove(old)
		delete(ls.m, old.Value.(*localLimiter).k)
	}
	return l
}

// allow takes n from (rule, key)'s local limiter; when it cannot, it says
// how long until it could.
func (ls *localLimiters) allow(ruleName, key string, n, limit int64, period time.Duration, now time.Time) (ok bool, retryAfter time.Duration, remaining int64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.get(ruleName, key, limit, period)
	if n > limit {
		return false, period, int64(l.lim.TokensAt(now))
	}
	if l.lim.AllowN(now, int(n)) {
		return true, 0, int64(l.lim.TokensAt(now))
	}
	tokens := l.lim.TokensAt(now)
	need := float64(n) - tokens
	return false, time.Duration(need / float64(l.lim.Limit()) * float64(time.Second)), int64(tokens)
}

// reserve is allow for Wait: it reserves n now if the wait is at most
// maxWait and returns the wait.
func (ls *localLimiters) reserve(ruleName, key string, n, limit int64, period time.Duration, now time.Time, maxWait time.Duration) (ok bool, wait time.Duration) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.get(ruleName, key, limit, period)
	if n > limit {
		return false, period
	}
	r := l.lim.ReserveN(now, int(n))
	if !r.OK() {
		return false, period
	}
	d := r.DelayFrom(now)
	if d > maxWait {
		r.CancelAt(now)
		return false, d
	}
	return true, d
}

// debit charges n permits to (rule, key)'s local limiter even past what
// it holds (rate.Limiter's reservations put it in debt), and returns what
// is left, what is owed, and how long until it admits again.
func (ls *localLimiters) debit(ruleName, key string, n, limit int64, period time.Duration, now time.Time) (remaining, debt int64, retryAfter time.Duration) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.get(ruleName, key, limit, period)
	for n > 0 && l.lim.Burst() > 0 {
		chunk := min(n, int64(l.lim.Burst()))
		l.lim.ReserveN(now, int(chunk))
		n -= chunk
	}
	tokens := l.lim.TokensAt(now)
	if tokens >= 1 {
		return int64(tokens), 0, 0
	}
	return 0, int64(math.Ceil(-tokens)), time.Duration((1 - tokens) / float64(l.lim.Limit()) * float64(time.Second))
}

// hold takes one of limit local concurrency slots of (rule, key).
func (ls *localLimiters) hold(ruleName, key string, limit int64, period time.Duration) (*localLimiter, bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.get(ruleName, key, limit, period)
	if l.inflight >= limit {
		return nil, false
	}
	l.inflight++
	return l, true
}

// unhold gives a local concurrency slot back.
func (ls *localLimiters) unhold(l *localLimiter) {
	ls.mu.Lock()
	if l.inflight > 0 {
		l.inflight--
	}
	ls.mu.Unlock()
}
