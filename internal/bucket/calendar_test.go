package bucket

import (
	"strings"
	"testing"
	"time"
)

const hour = int64(time.Hour)

// runAt plays steps against a calendar bucket made at start; step times
// are Unix nanoseconds.
func runAt(t *testing.T, c *Config, start int64, steps []step) {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatalf("config %+v: %v", c, err)
	}
	b := New(c, start)
	for i, s := range steps {
		switch s.op {
		case opAcquire:
			if got := b.Acquire(c, s.at, s.req); got != s.want {
				t.Errorf("step %d: at %v Acquire(%+v)\n got %+v\nwant %+v", i, time.Unix(0, s.at).In(c.location()), s.req, got, s.want)
			}
		case opRefill:
			if got := b.Refill(c, s.at, s.g, s.permits); got != s.n {
				t.Errorf("step %d: at %v Refill(%+v, %d) = %d, want %d", i, time.Unix(0, s.at).In(c.location()), s.g, s.permits, got, s.n)
			}
		case opIdle:
			if got := b.Idle(c, s.at); got != s.ok {
				t.Errorf("step %d: at %v Idle() = %v, want %v", i, time.Unix(0, s.at).In(c.location()), got, s.ok)
			}
		case opDebit:
			if got, err := b.Debit(c, s.at, s.permits); err != nil || got != s.commit {
				t.Errorf("step %d: at %v Debit(%d)\n got %+v, %v\nwant %+v", i, time.Unix(0, s.at).In(c.location()), s.permits, got, err, s.commit)
			}
		default:
			t.Fatalf("step %d: op %d not supported here", i, s.op)
		}
	}
}

func TestCalendarMonthAcrossDST(t *testing.T) {
	berlin := mustZone("Europe/Berlin")
	at := func(y int, m time.Month, d, h, mi int) int64 { return wall(berlin, y, m, d, h, mi) }
	c := &Config{Algorithm: FixedWindow, Limit: 3, Calendar: CalendarMonth, Location: berlin}
	// March 2024 loses an hour on the 31st at 02:00: it lasts 743h.
	march := at(2024, 3, 1, 0, 0)
	if got := at(2024, 4, 1, 0, 0) - march; got != 743*hour {
		t.Fatalf("March 2024 in Berlin lasts %v", time.Duration(got))
	}
	runAt(t, c, march, []step{
		acquire(march, 2, Result{Allowed: true, Granted: 2, Remaining: 1, ResetAfter: 743 * hour}),
		acquire(at(2024, 3, 31, 1, 30), 1, Result{Allowed: true, Granted: 1, ResetAfter: 21*hour + 30*int64(time.Minute)}),
		// 03:30 CEST is one hour after 01:30 CET.
		acquire(at(2024, 3, 31, 3, 30), 1, Result{RetryAfter: 20*hour + 30*int64(time.Minute), ResetAfter: 20*hour + 30*int64(time.Minute)}),
		acquire(at(2024, 3, 31, 23, 59), 1, Result{RetryAfter: int64(time.Minute), ResetAfter: int64(time.Minute)}),
		idle(at(2024, 4, 1, 0, 0)-1, false),
		idle(at(2024, 4, 1, 0, 0), true),
		// April lasts 720h; a grant of March gives nothing back in April.
		acquire(at(2024, 4, 1, 0, 0), 3, Result{Allowed: true, Granted: 3, ResetAfter: 720 * hour}),
		refill(at(2024, 4, 2, 0, 0), Grant{IssuedAt: at(2024, 3, 31, 1, 30), Permits: 1}, 1, 0),
		refill(at(2024, 4, 30, 23, 59), Grant{IssuedAt: at(2024, 4, 1, 0, 0), Permits: 3}, 1, 1),
	})

	// October 2024 gains an hour on the 27th at 03:00: it lasts 745h.
	oct := at(2024, 10, 1, 0, 0)
	nov := at(2024, 11, 1, 0, 0)
	if got := nov - oct; got != 745*hour {
		t.Fatalf("October 2024 in Berlin lasts %v", time.Duration(got))
	}
	fallBack := time.Date(2024, 10, 27, 1, 0, 0, 0, time.UTC).UnixNano() // 03:00 CEST = 02:00 CET
	runAt(t, c, oct, []step{
		acquire(fallBack-30*int64(time.Minute), 3, Result{Allowed: true, Granted: 3, ResetAfter: nov - fallBack + 30*int64(time.Minute)}),
		// 02:30 happens twice; both are October.
		acquire(fallBack+30*int64(time.Minute), 1, Result{RetryAfter: nov - fallBack - 30*int64(time.Minute), ResetAfter: nov - fallBack - 30*int64(time.Minute)}),
		acquire(nov, 3, Result{Allowed: true, Granted: 3, ResetAfter: 30 * 24 * hour}),
	})
}

func TestCalendarDayOf23And25Hours(t *testing.T) {
	berlin := mustZone("Europe/Berlin")
	at := func(y int, m time.Month, d, h, mi int) int64 { return wall(berlin, y, m, d, h, mi) }
	c := &Config{Algorithm: FixedWindow, Limit: 2, Calendar: CalendarDay, Location: berlin}
	runAt(t, c, at(2024, 3, 30, 12, 0), []step{
		acquire(at(2024, 3, 30, 12, 0), 2, Result{Allowed: true, Granted: 2, ResetAfter: 12 * hour}),
		acquire(at(2024, 3, 31, 0, 0), 2, Result{Allowed: true, Granted: 2, ResetAfter: 23 * hour}),
		acquire(at(2024, 3, 31, 23, 0), 1, Result{RetryAfter: hour, ResetAfter: hour}),
		acquire(at(2024, 4, 1, 0, 0), 2, Result{Allowed: true, Granted: 2, ResetAfter: 24 * hour}),
	})
	runAt(t, c, at(2024, 10, 27, 0, 0), []step{
		acquire(at(2024, 10, 27, 0, 0), 2, Result{Allowed: true, Granted: 2, ResetAfter: 25 * hour}),
		acquire(at(2024, 10, 27, 23, 0), 1, Result{RetryAfter: hour, ResetAfter: hour}),
		// Debt carries into the next local days: 5 held at a limit of 2,
		// 2 repaid a day; the 28th starts with 3 (full), the 29th with 1.
		debitStep(at(2024, 10, 27, 23, 0), 3, CommitResult{Debited: 3, Debt: 3, RetryAfter: 25 * hour}),
		acquire(at(2024, 10, 28, 12, 0), 1, Result{RetryAfter: 12 * hour, ResetAfter: 36 * hour}),
		acquire(at(2024, 10, 29, 0, 0), 1, Result{Allowed: true, Granted: 1, ResetAfter: 24 * hour}),
	})
}

func TestCalendarISOWeekAroundNewYear(t *testing.T) {
	utc := time.UTC
	at := func(y int, m time.Month, d, h int) int64 { return wall(utc, y, m, d, h, 0) }
	c := &Config{Algorithm: FixedWindow, Limit: 2, Calendar: CalendarWeek}
	// 2024-12-30 (a Monday) starts ISO week 1 of 2025.
	runAt(t, c, at(2024, 12, 29, 23), []step{
		acquire(at(2024, 12, 29, 23), 2, Result{Allowed: true, Granted: 2, ResetAfter: hour}),
		acquire(at(2024, 12, 30, 0), 1, Result{Allowed: true, Granted: 1, Remaining: 1, ResetAfter: 7 * 24 * hour}),
		acquire(at(2025, 1, 1, 12), 1, Result{Allowed: true, Granted: 1, ResetAfter: 4*24*hour + 12*hour}),
		// Monday and the next Sunday are one window, across the new year.
		refill(at(2025, 1, 5, 23), Grant{IssuedAt: at(2024, 12, 30, 0), Permits: 1}, 1, 1),
		acquire(at(2025, 1, 6, 0), 2, Result{Allowed: true, Granted: 2, ResetAfter: 7 * 24 * hour}),
	})
	// 2021-01-01 (a Friday) is in ISO week 53 of 2020, Monday 2020-12-28 to
	// Monday 2021-01-04.
	runAt(t, c, at(2020, 12, 31, 0), []step{
		acquire(at(2020, 12, 31, 0), 2, Result{Allowed: true, Granted: 2, ResetAfter: 4 * 24 * hour}),
		acquire(at(2021, 1, 3, 23), 1, Result{RetryAfter: hour, ResetAfter: hour}),
		acquire(at(2021, 1, 4, 0), 1, Result{Allowed: true, Granted: 1, Remaining: 1, ResetAfter: 7 * 24 * hour}),
	})
}

func TestCalendarClockBackwards(t *testing.T) {
	berlin := mustZone("Europe/Berlin")
	at := func(y int, m time.Month, d, h, mi int) int64 { return wall(berlin, y, m, d, h, mi) }
	c := &Config{Algorithm: FixedWindow, Limit: 2, Calendar: CalendarDay, Location: berlin}
	runAt(t, c, at(2024, 6, 1, 23, 0), []step{
		acquire(at(2024, 6, 2, 0, 30), 2, Result{Allowed: true, Granted: 2, ResetAfter: 23*hour + 30*int64(time.Minute)}),
		// The clock steps back into the previous day: it counts as the
		// latest time seen, so the new day's count holds.
		acquire(at(2024, 6, 1, 23, 30), 1, Result{RetryAfter: 23*hour + 30*int64(time.Minute), ResetAfter: 23*hour + 30*int64(time.Minute)}),
		idle(at(2024, 6, 1, 12, 0), false),
		acquire(at(2024, 6, 3, 0, 0), 2, Result{Allowed: true, Granted: 2, ResetAfter: 24 * hour}),
	})
}

// TestCalendarSkippedMidnight: where DST starts at midnight (Chile), the
// day starts at the transition, 01:00; where it ends at midnight, the day
// before lasts 25 hours.
func TestCalendarSkippedMidnight(t *testing.T) {
	santiago := mustZone("America/Santiago")
	c := &Config{Algorithm: FixedWindow, Limit: 1, Calendar: CalendarDay, Location: santiago}
	for _, tc := range []struct {
		y       int
		m       time.Month
		d       int
		startAt time.Time // the first instant of the day
		hours   int64     // its length
	}{
		{2024, 9, 8, time.Date(2024, 9, 8, 4, 0, 0, 0, time.UTC), 23},
		{2024, 9, 7, time.Date(2024, 9, 7, 4, 0, 0, 0, time.UTC), 24},
		{2024, 4, 6, time.Date(2024, 4, 6, 3, 0, 0, 0, time.UTC), 25},
		{2024, 4, 7, time.Date(2024, 4, 7, 4, 0, 0, 0, time.UTC), 24},
	} {
		day := daysFromCivil(int64(tc.y), int64(tc.m), int64(tc.d))
		start, next := calStart(c, day), calStart(c, day+1)
		if start != tc.startAt.UnixNano() || next-start != tc.hours*hour {
			t.Errorf("%d-%02d-%02d starts %v and lasts %v, want %v and %dh", tc.y, tc.m, tc.d,
				time.Unix(0, start).UTC(), time.Duration(next-start), tc.startAt, tc.hours)
		}
	}
}

func TestCivilDays(t *testing.T) {
	for d := int64(-800_000); d <= 800_000; d += 7 {
		y, m, dd := civilFromDays(d)
		tm := time.Unix(d*86400, 0).UTC()
		if int(y) != tm.Year() || time.Month(m) != tm.Month() || int(dd) != tm.Day() || daysFromCivil(y, m, dd) != d {
			t.Fatalf("day %d: %d-%d-%d, time says %v", d, y, m, dd, tm)
		}
	}
}

func TestCalendarValidate(t *testing.T) {
	berlin := mustZone("Europe/Berlin")
	for _, tc := range []struct {
		c    Config
		want string // "" means valid
	}{
		{Config{Algorithm: FixedWindow, Limit: 5, Calendar: CalendarMonth, Location: berlin}, ""},
		{Config{Algorithm: FixedWindow, Limit: 5, Calendar: CalendarDay}, ""},
		{Config{Algorithm: FixedWindow, Limit: 5, Period: sec, Calendar: CalendarWeek}, ""},
		{Config{Algorithm: TokenBucket, Limit: 5, Period: sec, Calendar: CalendarDay}, "fixed-window only"},
		{Config{Algorithm: FixedWindow, Limit: 5, Period: sec, Location: berlin}, "calendar windows only"},
		{Config{Algorithm: FixedWindow, Limit: 5, Calendar: CalendarMonth + 1}, "unknown calendar"},
		{Config{Algorithm: FixedWindow, Limit: 5, Period: -1, Calendar: CalendarDay}, "period must be >= 0"},
		{Config{Algorithm: FixedWindow, Limit: 5}, "period must be > 0"},
	} {
		err := tc.c.Validate()
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.c, err, tc.want)
		}
	}
	for _, s := range []string{"none", "day", "week", "month"} {
		if k, err := ParseCalendar(s); err != nil || k.String() != s {
			t.Errorf("ParseCalendar(%q) = %v, %v", s, k, err)
		}
	}
	if _, err := ParseCalendar("year"); err == nil {
		t.Error("ParseCalendar(year) succeeded")
	}
}
