package shard

import (
	"errors"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// TestCalendarMonthAcrossDSTInShard: a monthly quota in Europe/Berlin
// through the shard, on a fake wall clock, across the March 2024 spring
// forward (March lasts 743 h): reset_after is the time to the next local
// month boundary, a commit settles within the month, the sweep keeps the
// bucket until the boundary, and April starts a fresh quota.
func TestCalendarMonthAcrossDSTInShard(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no time zone database: %v", err)
	}
	at := func(m time.Month, d, h, mi int) int64 { return time.Date(2024, m, d, h, mi, 0, 0, berlin).UnixNano() }
	hour, minute := int64(time.Hour), int64(time.Minute)
	april := at(4, 1, 0, 0)
	s, get := store(t, &rule.Rule{Name: "quota", Algorithm: bucket.FixedWindow, Limit: 10, Calendar: bucket.CalendarMonth, TimeZone: "Europe/Berlin"})
	c := get("quota")
	m := New(Config{})
	for i, st := range []struct {
		now     int64
		permits int64
		allowed bool
		remain  int64
		reset   int64
	}{
		{at(3, 1, 0, 0), 4, true, 6, 743 * hour},
		{at(3, 31, 1, 30), 5, true, 1, 21*hour + 30*minute},
		// One hour of wall time later it is 03:30 CEST: 20h30m to April.
		{at(3, 31, 3, 30), 2, false, 1, 20*hour + 30*minute},
		{april - 1, 1, true, 0, 1},
		{april, 10, true, 0, 30 * 24 * hour},
	} {
		d, err := m.Acquire(c, "tenant", bucket.Request{Permits: st.permits}, st.now)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d.Allowed != st.allowed || d.Remaining != st.remain || d.ResetAfter != st.reset {
			t.Fatalf("step %d at %v: allowed %v remaining %d reset_after %v; want %v %d %v", i, time.Unix(0, st.now).In(berlin),
				d.Allowed, d.Remaining, time.Duration(d.ResetAfter), st.allowed, st.remain, time.Duration(st.reset))
		}
		if i == 1 {
			// Settle the 5 at 2 after the clocks jumped: 3 come back.
			res, err := m.Commit(c, "tenant", d.Grant.String(), 2, at(3, 31, 3, 0))
			if err != nil || res.Remaining != 4 {
				t.Fatalf("commit: %+v, %v; want 4 remaining", res, err)
			}
			// Spend 3 of them again, so that the next step finds 1.
			if d, err := m.Acquire(c, "tenant", bucket.Request{Permits: 3}, at(3, 31, 3, 0)); err != nil || !d.Allowed {
				t.Fatalf("re-acquire: %+v %v", d, err)
			}
		}
		if i == 2 {
			if n := m.Sweep(april-1, s.Table()); n != 0 {
				t.Fatalf("swept a bucket with a spent March quota %d ns before April", april-1-st.now)
			}
		}
	}
	// A March grant settled in April gives nothing back (March is over)
	// but charges its overrun to April, as debt the work incurred; past
	// its reservation window (32 days for a month) it is expired.
	d, err := m.Acquire(c, "other", bucket.Request{Permits: 1}, at(3, 31, 23, 0))
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	if res, err := m.Commit(c, "other", d.Grant.String(), 5, april+hour); err != nil || res.Remaining != 6 {
		t.Fatalf("commit of a March grant in April: %+v, %v; want 4 charged to April (6 left)", res, err)
	}
	d, err = m.Acquire(c, "third", bucket.Request{Permits: 1}, at(3, 31, 23, 0))
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	if _, err := m.Commit(c, "third", d.Grant.String(), 5, at(3, 31, 23, 0)+32*24*hour); !errors.Is(err, ErrGrantExpired) {
		t.Fatalf("commit 32 days later: %v, want ErrGrantExpired", err)
	}
}
