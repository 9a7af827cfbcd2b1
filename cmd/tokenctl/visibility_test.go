package main

import (
	"strconv"
	"strings"
	"testing"
)

func TestTopAndHistory(t *testing.T) {
	addr := startServer(t)
	ok(t, addr, "rule", "put", "api", "--algorithm", "token-bucket", "--limit", "3", "--period", "1m")
	for _, key := range []string{"hot", "hot", "hot", "hot", "warm", "warm", "cold"} {
		ok(t, addr, "acquire", "api", key)
	}
	var top struct {
		Keys []struct {
			Key   string `json:"key"`
			Count int64  `json:"count"`
			Error int64  `json:"error"`
		} `json:"keys"`
	}
	decode(t, ok(t, addr, "top", "api", "-o", "json"), &top)
	if len(top.Keys) != 3 || top.Keys[0].Key != "hot" || top.Keys[0].Count != 3 || top.Keys[1].Key != "warm" {
		t.Errorf("top keys %+v, want hot (3), warm, cold", top.Keys)
	}
	decode(t, ok(t, addr, "top", "api", "--denied", "-n", "1", "-o", "json"), &top)
	if len(top.Keys) != 1 || top.Keys[0].Key != "hot" || top.Keys[0].Count != 1 {
		t.Errorf("top denied %+v, want hot (1)", top.Keys)
	}
	if out := ok(t, addr, "top", "api"); !strings.Contains(out, "hot") || !strings.Contains(out, "ADMITTED") {
		t.Errorf("table output:\n%s", out)
	}

	ok(t, addr, "rule", "put", "api", "--algorithm", "token-bucket", "--limit", "9", "--period", "1m")
	var hist struct {
		Versions []struct {
			Version uint64 `json:"version"`
			Change  string `json:"change"`
			Rule    struct {
				Limit string `json:"limit"`
			} `json:"rule"`
		} `json:"versions"`
	}
	decode(t, ok(t, addr, "rule", "history", "api", "-o", "json"), &hist)
	if len(hist.Versions) != 2 || hist.Versions[0].Rule.Limit != "9" || hist.Versions[1].Rule.Limit != "3" {
		t.Fatalf("history %+v, want limit 9 then 3", hist.Versions)
	}
	old := hist.Versions[1].Version
	ok(t, addr, "rule", "rollback", "api", "--to-version", strconv.FormatUint(old, 10))
	decode(t, ok(t, addr, "rule", "history", "api", "-o", "json"), &hist)
	if hist.Versions[0].Change != "ROLLBACK" || hist.Versions[0].Rule.Limit != "3" {
		t.Errorf("after rollback %+v, want ROLLBACK to limit 3", hist.Versions[0])
	}

	f := writeFile(t, "name: api\nalgorithm: TOKEN_BUCKET\nlimit: 5\nperiod: 1m\n---\nname: fresh\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\n")
	out := ok(t, addr, "rule", "diff", "-f", f)
	if !strings.Contains(out, "UPDATE") || !strings.Contains(out, "limit") || !strings.Contains(out, "CREATE") {
		t.Errorf("diff output:\n%s", out)
	}
	if r := tokenctl(t, "", "--server", addr, "rule", "get", "fresh"); r.err == nil {
		t.Error("rule diff created a rule")
	}
}
