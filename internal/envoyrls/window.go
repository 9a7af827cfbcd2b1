package envoyrls

import (
	"fmt"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Unit is the time unit of a limit, as RLS v3 spells it.
type Unit = rlpb.RateLimitResponse_RateLimit_Unit

// The units the reference implementation knows.
const (
	UnitUnknown = rlpb.RateLimitResponse_RateLimit_UNKNOWN
	UnitSecond  = rlpb.RateLimitResponse_RateLimit_SECOND
	UnitMinute  = rlpb.RateLimitResponse_RateLimit_MINUTE
	UnitHour    = rlpb.RateLimitResponse_RateLimit_HOUR
	UnitDay     = rlpb.RateLimitResponse_RateLimit_DAY
	UnitWeek    = rlpb.RateLimitResponse_RateLimit_WEEK
	UnitMonth   = rlpb.RateLimitResponse_RateLimit_MONTH
	UnitYear    = rlpb.RateLimitResponse_RateLimit_YEAR
)

// UnitSeconds is the length of a unit's window in seconds, as the reference
// counts it: a WEEK is 7 days, a MONTH 30 days and a YEAR 365 days, all
// counted from the Unix epoch (so a week starts on a Thursday, and months and
// years drift from the calendar). It returns 0 for UNKNOWN or any other value.
func UnitSeconds(u Unit) int64 {
	switch u {
	case UnitSecond:
		return 1
	case UnitMinute:
		return 60
	case UnitHour:
		return 60 * 60
	case UnitDay:
		return 60 * 60 * 24
	case UnitWeek:
		return 60 * 60 * 24 * 7
	case UnitMonth:
		return 60 * 60 * 24 * 30
	case UnitYear:
		return 60 * 60 * 24 * 365
	}
	return 0
}

// ValidUnit reports whether u is one of SECOND..YEAR.
func ValidUnit(u Unit) bool { return UnitSeconds(u) > 0 }

// Period is UnitSeconds as a time.Duration.
func Period(u Unit) time.Duration { return time.Duration(UnitSeconds(u)) * time.Second }

// WindowStart is the Unix second at which the window holding nowUnix starts:
// nowUnix rounded down to a multiple of the unit, as the reference's cache
// key does. It panics on an invalid unit, which ValidateRequest and the
// config parser rule out.
func WindowStart(u Unit, nowUnix int64) int64 {
	d := mustSeconds(u)
	return (nowUnix / d) * d
}

// DurationUntilReset is the time left in the window holding nowUnix, in whole
// seconds: the unit minus nowUnix modulo the unit, as the reference computes
// it (so it is never 0: at a window's first second it is the whole unit).
func DurationUntilReset(u Unit, nowUnix int64) time.Duration {
	d := mustSeconds(u)
	return time.Duration(d-nowUnix%d) * time.Second
}

func mustSeconds(u Unit) int64 {
	d := UnitSeconds(u)
	if d == 0 {
		panic(fmt.Sprintf("envoyrls: invalid unit %v", u))
	}
	return d
}
