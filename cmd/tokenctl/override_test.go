package main

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/auth"
)

// TestOverrideSetListDelete: runtime overrides through tokenctl, in every
// output style.
func TestOverrideSetListDelete(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	ok(t, addr, "rule", "put", "llm", "--algorithm", "token-bucket", "--limit", "100", "--period", "1m")

	var set struct {
		Rule, Key, Limit, Burst, ExpiresUnixNs, Version string
	}
	decode(t, ok(t, addr, "-o", "json", "override", "set", "llm", "acme", "--limit", "5000", "--burst", "6000"), &set)
	if set.Rule != "llm" || set.Key != "acme" || set.Limit != "5000" || set.Burst != "6000" || set.Version == "" {
		t.Errorf("override set -o json = %+v", set)
	}
	before := time.Now()
	table := ok(t, addr, "override", "set", "llm", "premium-*", "--limit", "1000", "--expires", "1h")
	if !strings.Contains(table, "premium-*") || !strings.Contains(table, "1000") || strings.Contains(table, "never") {
		t.Errorf("override set table:\n%s", table)
	}

	var list struct {
		Overrides []struct {
			Key, Limit, ExpiresUnixNs string
		}
	}
	decode(t, ok(t, addr, "-o", "json", "override", "list", "llm"), &list)
	if len(list.Overrides) != 2 || list.Overrides[0].Key != "acme" || list.Overrides[1].Key != "premium-*" {
		t.Fatalf("override list -o json = %+v", list)
	}
	ns, err := strconv.ParseInt(list.Overrides[1].ExpiresUnixNs, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Unix(0, ns)
	if d := exp.Sub(before); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("--expires 1h set the expiry %v from now", d)
	}
	if y := ok(t, addr, "-o", "yaml", "override", "list", "llm"); !strings.Contains(y, "key: premium-*") && !strings.Contains(y, "key: 'premium-*'") {
		t.Errorf("override list -o yaml:\n%s", y)
	}
	if tab := ok(t, addr, "override", "list", "llm"); !strings.HasPrefix(tab, "RULE") || strings.Count(tab, "\n") != 3 {
		t.Errorf("override list table:\n%s", tab)
	}

	if out := ok(t, addr, "override", "delete", "llm", "acme"); !strings.Contains(out, "deleted override acme of rule llm") {
		t.Errorf("override delete: %q", out)
	}
	var del map[string]string
	decode(t, ok(t, addr, "-o", "json", "override", "delete", "llm", "premium-*"), &del)
	if del["deleted"] != "premium-*" || del["rule"] != "llm" {
		t.Errorf("override delete -o json = %v", del)
	}
	r := tokenctl(t, "", "--server", addr, "override", "list", "llm")
	if r.err != nil || r.stdout != "" || !strings.Contains(r.stderr, "no overrides") {
		t.Errorf("override list of none: %+v", r)
	}
}

// TestOverrideErrors: bad flags are usage errors naming the flag; what
// the server refuses comes back with its code.
func TestOverrideErrors(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	ok(t, addr, "rule", "put", "llm", "--algorithm", "token-bucket", "--limit", "100", "--period", "1m")
	for _, tc := range []struct {
		name  string
		args  []string
		usage bool
		code  codes.Code
		want  string
	}{
		{"missing limit", []string{"override", "set", "llm", "k"}, true, 0, "--limit"},
		{"zero limit", []string{"override", "set", "llm", "k", "--limit", "0"}, true, 0, "--limit"},
		{"zero burst", []string{"override", "set", "llm", "k", "--limit", "5", "--burst", "0"}, true, 0, "--burst"},
		{"negative expiry", []string{"override", "set", "llm", "k", "--limit", "5", "--expires", "-1s"}, true, 0, "--expires"},
		{"bad expiry", []string{"override", "set", "llm", "k", "--limit", "5", "--expires", "soon"}, true, 0, "--expires"},
		{"missing key", []string{"override", "set", "llm", "--limit", "5"}, true, 0, "KEY"},
		{"star inside", []string{"override", "set", "llm", "a*b", "--limit", "5"}, false, codes.InvalidArgument, "*"},
		{"two stars", []string{"override", "set", "llm", "a**", "--limit", "5"}, false, codes.InvalidArgument, "*"},
		{"unknown rule", []string{"override", "set", "nosuch", "k", "--limit", "5"}, false, codes.NotFound, "nosuch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tokenctl(t, "", append([]string{"--server", addr}, tc.args...)...)
			if r.err == nil {
				t.Fatal("no error")
			}
			var ue *usageError
			if got := errors.As(r.err, &ue); got != tc.usage {
				t.Errorf("usage error = %v, want %v (%v)", got, tc.usage, r.err)
			}
			if !tc.usage && status.Code(r.err) != tc.code {
				t.Errorf("code %v, want %v (%v)", status.Code(r.err), tc.code, r.err)
			}
			if !strings.Contains(r.err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", r.err, tc.want)
			}
		})
	}
}

// TestRulePutCostFlags: the calendar, inline, reservation and durable
// flags reach the rule; --period is not needed with --calendar; bad
// values are usage errors naming the flag.
func TestRulePutCostFlags(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	var cal struct {
		Calendar, TimeZone, Period string
	}
	decode(t, ok(t, addr, "-o", "json", "rule", "put", "monthly", "--algorithm", "fixed-window", "--limit", "1000000",
		"--calendar", "month", "--time-zone", "Europe/Berlin"), &cal)
	if cal.Calendar != "MONTH" || cal.TimeZone != "Europe/Berlin" || (cal.Period != "" && cal.Period != "0s") {
		t.Errorf("calendar rule = %+v", cal)
	}
	if tab := ok(t, addr, "rule", "get", "monthly"); !strings.Contains(tab, "month in Europe/Berlin") {
		t.Errorf("rule get table lacks the calendar:\n%s", tab)
	}
	var in struct {
		Inline         struct{ MaxLimit, MaxPeriod string }
		ReservationTtl string
	}
	decode(t, ok(t, addr, "-o", "json", "rule", "put", "llm", "--algorithm", "token-bucket", "--limit", "1000", "--period", "1m",
		"--inline-max-limit", "100000", "--inline-max-period", "1h", "--reservation-ttl", "30s"), &in)
	if in.Inline.MaxLimit != "100000" || in.Inline.MaxPeriod != "3600s" || in.ReservationTtl != "30s" {
		t.Errorf("inline rule = %+v", in)
	}
	if tab := ok(t, addr, "rule", "get", "llm"); !strings.Contains(tab, "max limit 100000, max period 1h0m0s") || !strings.Contains(tab, "reservation ttl:") {
		t.Errorf("rule get table lacks the inline policy or the reservation ttl:\n%s", tab)
	}

	base := []string{"--server", addr, "rule", "put", "r", "--algorithm", "fixed-window", "--limit", "3"}
	for _, tc := range []struct {
		name  string
		args  []string
		usage bool
		code  codes.Code
		want  string
	}{
		{"bad calendar", []string{"--calendar", "fortnight"}, true, 0, "--calendar"},
		{"bad time zone", []string{"--calendar", "day", "--time-zone", "Mars/Olympus"}, true, 0, "--time-zone"},
		{"time zone without calendar", []string{"--period", "1s", "--time-zone", "UTC"}, true, 0, "--time-zone"},
		{"no period nor calendar", nil, true, 0, "--period"},
		{"inline limit zero", []string{"--period", "1s", "--inline-max-limit", "0"}, true, 0, "--inline-max-limit"},
		{"inline period alone", []string{"--period", "1s", "--inline-max-period", "1m"}, true, 0, "--inline-max-period"},
		{"inline period negative", []string{"--period", "1s", "--inline-max-limit", "5", "--inline-max-period", "-1s"}, true, 0, "--inline-max-period"},
		{"reservation ttl zero", []string{"--period", "1s", "--reservation-ttl", "0s"}, true, 0, "--reservation-ttl"},
		{"reservation ttl syntax", []string{"--period", "1s", "--reservation-ttl", "x"}, true, 0, "--reservation-ttl"},
		{"calendar on a token bucket", []string{"--algorithm", "token-bucket", "--calendar", "day"}, false, codes.InvalidArgument, "calendar"},
		{"reservation ttl past the window", []string{"--period", "1s", "--reservation-ttl", "1m"}, false, codes.InvalidArgument, "reservation_ttl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tokenctl(t, "", append(append([]string{}, base...), tc.args...)...)
			if r.err == nil {
				t.Fatal("no error")
			}
			var ue *usageError
			if got := errors.As(r.err, &ue); got != tc.usage {
				t.Errorf("usage error = %v, want %v (%v)", got, tc.usage, r.err)
			}
			if !tc.usage && status.Code(r.err) != tc.code {
				t.Errorf("code %v, want %v (%v)", status.Code(r.err), tc.code, r.err)
			}
			if !strings.Contains(r.err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", r.err, tc.want)
			}
		})
	}
}

// TestTokenCreateScoped: token create writes a scoped role field
// (client,editor:team-a/*) that the server's token file reader accepts
// with that scope, and refuses a scope the server would refuse.
func TestTokenCreateScoped(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "tokens")
	r := tokenctl(t, "", "-o", "json", "token", "create", "team-a", "client,editor:team-a/*", "--append", file)
	if r.err != nil {
		t.Fatal(r.err)
	}
	var out map[string]string
	decode(t, r.stdout, &out)
	if out["roles"] != "client,editor:team-a/*" || !strings.HasSuffix(out["line"], " team-a client,editor:team-a/*") {
		t.Errorf("token create of a scoped role: %v", out)
	}
	a, err := auth.New(auth.Options{TokenFile: file, ReloadInterval: -1})
	if err != nil {
		t.Fatalf("the server refuses the line token create wrote: %v", err)
	}
	a.Close()
	for _, bad := range []string{"admin:team-a/*", "editor:*", "editor:a*b"} {
		if r := tokenctl(t, "", "token", "create", "x", bad); !errors.As(r.err, new(*usageError)) {
			t.Errorf("token create x %q: %v, want a usage error", bad, r.err)
		}
	}
}
