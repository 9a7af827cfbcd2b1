package main

import (
	"testing"

	"github.com/tokenserver/tokenserver/internal/rulepb"
)

// FuzzParseRules: decoding a rules file (YAML documents of the proto's JSON
// field names) never panics, and every rule it returns validates.
func FuzzParseRules(f *testing.F) {
	f.Add([]byte("name: api\nalgorithm: TOKEN_BUCKET\nlimit: 10\nperiod: 1s\n"))
	f.Add([]byte("- name: a\n  algorithm: SLIDING_LOG\n  limit: 5\n  period: 1m\n---\nname: b\nalgorithm: CONCURRENCY\nlimit: 3\nperiod: 30s\n"))
	f.Add([]byte("name: x\nalgorithm: TOKEN_BUCKET\nlimit: 9223372036854775807\nperiod: 99999999999s\ndeny: [\"\\xff\"]\n"))
	f.Add([]byte("rules:\n  - name: a\n    limit: 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rules, err := parseRules(data)
		if err != nil {
			return
		}
		for _, pr := range rules {
			r := rulepb.FromProto(pr.rule)
			r.Normalize()
			if err := r.Validate(); err != nil {
				t.Fatalf("parseRules returned an invalid rule (doc %d, line %d): %v", pr.doc, pr.line, err)
			}
		}
	})
}
