package main

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCommit reserves an estimate with acquire and settles it with commit:
// less gives back, more runs into debt, a second commit changes nothing,
// and bad flags or grants are refused.
func TestCommit(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	// A fixed window counts whole permits, so every balance is exact.
	ok(t, addr, "rule", "put", "llm", "--algorithm", "fixed-window", "--limit", "100", "--period", "1h")
	type commitJSON struct {
		Remaining    int64 `json:"remaining"`
		Debt         int64 `json:"debt"`
		RetryAfterNs int64 `json:"retryAfterNs"`
	}
	var got acquireJSON
	decode(t, ok(t, addr, "acquire", "llm", "a", "--permits", "40", "-o", "json"), &got)
	var c commitJSON
	decode(t, ok(t, addr, "commit", "llm", "a", "--grant", got.LastGrantID, "--used", "10", "-o", "json"), &c)
	if c.Remaining != 90 || c.Debt != 0 {
		t.Errorf("commit of 10 of 40 = %+v, want 90 remaining", c)
	}
	decode(t, ok(t, addr, "commit", "llm", "a", "--grant", got.LastGrantID, "--used", "99", "-o", "json"), &c)
	if c.Remaining != 90 || c.Debt != 0 {
		t.Errorf("a second commit of the grant = %+v, want it to change nothing (90 remaining)", c)
	}

	decode(t, ok(t, addr, "acquire", "llm", "b", "--permits", "80", "-o", "json"), &got)
	decode(t, ok(t, addr, "commit", "llm", "b", "--grant", got.LastGrantID, "--used", "130", "-o", "json"), &c)
	if c.Remaining != 0 || c.Debt != 30 || c.RetryAfterNs <= 0 {
		t.Errorf("commit of 130 of 80 = %+v, want debt 30 and a retry after", c)
	}

	for _, tc := range []struct {
		name string
		args []string
		flag string
	}{
		{"no grant", []string{"commit", "llm", "a", "--used", "1"}, "--grant"},
		{"no used", []string{"commit", "llm", "a", "--grant", got.LastGrantID}, "--used"},
		{"negative used", []string{"commit", "llm", "a", "--grant", got.LastGrantID, "--used", "-1"}, "--used"},
		{"limit period without limit", []string{"acquire", "llm", "a", "--limit-period", "1m"}, "--limit"},
		{"zero limit", []string{"acquire", "llm", "a", "--limit", "0"}, "--limit"},
	} {
		r := tokenctl(t, "", append([]string{"--server", addr}, tc.args...)...)
		if !errors.As(r.err, new(*usageError)) || !strings.Contains(r.err.Error(), tc.flag) {
			t.Errorf("%s: %v, want a usage error naming %s", tc.name, r.err, tc.flag)
		}
	}
	r := tokenctl(t, "", "--server", addr, "commit", "llm", "a", "--grant", "garbage", "--used", "1")
	if status.Code(r.err) != codes.InvalidArgument {
		t.Errorf("commit with a bad grant: %v, want InvalidArgument", r.err)
	}
}

// TestAcquireInlineLimit carries a limit in the request: allowed up to the
// rule's inline policy, refused past it and on a rule without one.
func TestAcquireInlineLimit(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	ok(t, addr, "rule", "put", "llm", "--algorithm", "fixed-window", "--limit", "100", "--period", "1h",
		"--inline-max-limit", "500", "--inline-max-period", "1h")
	ok(t, addr, "rule", "put", "plain", "--algorithm", "fixed-window", "--limit", "100", "--period", "1h")
	var got acquireJSON
	decode(t, ok(t, addr, "acquire", "llm", "t", "--permits", "5", "--limit", "20", "-o", "json"), &got)
	if got.Allowed != 1 || got.Remaining != 15 {
		t.Errorf("acquire under a request limit of 20 = %+v, want 15 remaining", got)
	}
	for _, tc := range []struct {
		rule, limit, want string
	}{
		{"llm", "501", "inline.max_limit"},
		{"plain", "5", "no inline policy"},
	} {
		r := tokenctl(t, "", "--server", addr, "acquire", tc.rule, "t", "--limit", tc.limit)
		if status.Code(r.err) != codes.InvalidArgument || !strings.Contains(r.err.Error(), tc.want) {
			t.Errorf("acquire %s --limit %s: %v, want InvalidArgument naming %q", tc.rule, tc.limit, r.err, tc.want)
		}
	}
}
