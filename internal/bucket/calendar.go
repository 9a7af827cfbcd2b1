package bucket

import (
	"fmt"
	"time"
)

// Calendar names the local calendar unit a FixedWindow counts in.
type Calendar uint8

// The calendars. Their numbers match tokenserver.v1.Calendar.
const (
	// CalendarNone means windows of Config.Period.
	CalendarNone Calendar = iota
	// CalendarDay is a local day, midnight to midnight (23 to 25 hours
	// across DST).
	CalendarDay
	// CalendarWeek is an ISO week, Monday 00:00 to the next Monday 00:00.
	CalendarWeek
	// CalendarMonth is a local calendar month, from the 1st at 00:00.
	CalendarMonth
)

var calendarNames = [...]string{"none", "day", "week", "month"}

// String returns the calendar's name as tokenctl spells it (month).
func (k Calendar) String() string {
	if int(k) < len(calendarNames) {
		return calendarNames[k]
	}
	return fmt.Sprintf("calendar(%d)", uint8(k))
}

// ParseCalendar reads a name as String returns it.
func ParseCalendar(s string) (Calendar, error) {
	for i, n := range calendarNames {
		if n == s {
			return Calendar(i), nil
		}
	}
	return CalendarNone, fmt.Errorf("unknown calendar %q (want day, week, month or none)", s)
}

// location is Location with its default applied.
func (c *Config) location() *time.Location {
	if c.Location != nil {
		return c.Location
	}
	return time.UTC
}

// sameWindows reports whether a and b cut time into the same windows.
func sameWindows(a, b *Config) bool {
	if a.Calendar != b.Calendar {
		return false
	}
	if a.Calendar == CalendarNone {
		return a.Period == b.Period
	}
	return a.location().String() == b.location().String()
}

// daysFromCivil is the number of days from 1970-01-01 to the proleptic
// Gregorian date y-m-d (Howard Hinnant's algorithm).
func daysFromCivil(y, m, d int64) int64 {
	if m <= 2 {
		y--
	}
	era := floorDiv(y, 400)
	yoe := y - era*400
	doy := (153*((m+9)%12)+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// civilFromDays is the inverse of daysFromCivil.
func civilFromDays(z int64) (y, m, d int64) {
	z += 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = doy - (153*mp+2)/5 + 1
	m = mp + 3
	if m > 12 {
		m -= 12
	}
	y = yoe + era*400
	if m <= 2 {
		y++
	}
	return y, m, d
}

// dayIndex is the local date of the Unix time t, in days since 1970-01-01.
func dayIndex(loc *time.Location, t int64) int64 {
	y, m, d := time.Unix(0, t).In(loc).Date()
	return daysFromCivil(int64(y), int64(m), int64(d))
}

// calIndex is the index of the calendar window holding the Unix time t:
// days since 1970-01-01, ISO weeks since the one holding it, or months
// since year 0.
func calIndex(c *Config, t int64) int64 {
	d := dayIndex(c.location(), t)
	switch c.Calendar {
	case CalendarWeek:
		return floorDiv(d+3, 7) // 1970-01-01 was a Thursday
	case CalendarMonth:
		y, m, _ := civilFromDays(d)
		return y*12 + m - 1
	}
	return d
}

// calFirstDay is the first local day of window i, in days since 1970-01-01.
func calFirstDay(c *Config, i int64) int64 {
	switch c.Calendar {
	case CalendarWeek:
		return 7*i - 3
	case CalendarMonth:
		return daysFromCivil(floorDiv(i, 12), floorMod(i, 12)+1, 1)
	}
	return i
}

// calStart is when window i starts: the first instant whose local date is
// on or after its first day. time.Date gives it unless DST skips or repeats
// that midnight, where a search over the instants around it does.
func calStart(c *Config, i int64) int64 {
	loc := c.location()
	day := calFirstDay(c, i)
	y, m, d := civilFromDays(day)
	guess := time.Date(int(y), time.Month(m), int(d), 0, 0, 0, 0, loc).UnixNano()
	if dayIndex(loc, guess) >= day && dayIndex(loc, guess-1) < day {
		return guess
	}
	const reach = 48 * int64(time.Hour) // more than any zone moves a midnight
	lo, hi := guess-reach, guess+reach  // dayIndex(lo) < day <= dayIndex(hi)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if dayIndex(loc, mid) >= day {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// calWindow returns the index of the window holding now, at least minIdx,
// and when it ends. Windows never move backwards, even where a zone's
// local date does.
func calWindow(c *Config, now, minIdx int64) (idx, end int64) {
	idx = max(calIndex(c, now), minIdx)
	end = calStart(c, idx+1)
	for end <= now {
		idx++
		end = calStart(c, idx+1)
	}
	return idx, end
}

// calMaxWindows is more windows than fit in maxDur: past it a boundary is
// reported as maxDur away rather than computed.
func calMaxWindows(c *Config) int64 {
	const hour = int64(time.Hour)
	short := 22 * hour // a day shortened by DST, with room for odd zones
	switch c.Calendar {
	case CalendarWeek:
		short = 7*24*hour - 2*hour
	case CalendarMonth:
		short = 28*24*hour - 2*hour
	}
	return maxDur/short + 2
}
