package rulefile

import (
	"testing"
)

// FuzzParseRules: reading a rules file never panics, every rule it returns
// validates as the server validates it, and every error has a position
// inside the file or none.
func FuzzParseRules(f *testing.F) {
	f.Add([]byte("name: api\nalgorithm: TOKEN_BUCKET\nlimit: 10\nperiod: 1s\n"))
	f.Add([]byte("- name: a\n  algorithm: SLIDING_LOG\n  limit: 5\n  period: 1m\n---\nname: b\nalgorithm: CONCURRENCY\nlimit: 3\nperiod: 30s\n"))
	f.Add([]byte("name: x\nalgorithm: TOKEN_BUCKET\nlimit: 9223372036854775807\nperiod: 99999999999s\ndeny: [\"\\xff\"]\n"))
	f.Add([]byte("rules:\n  - name: a\n    limit: 1\n"))
	f.Add([]byte("- &b {name: a, algorithm: TOKEN_BUCKET, limit: 1, period: 1s}\n- <<: *b\n  name: c\n  overrides: [{key: k, limit: 0}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rules, err := Parse("f.yaml", data)
		if err != nil {
			return
		}
		for _, r := range rules {
			n := r.Rule.Clone()
			n.Normalize()
			if err := n.Validate(); err != nil {
				t.Fatalf("Parse returned an invalid rule (at %s): %v", r.Pos, err)
			}
			if r.Pos.Line < 1 || r.Pos.Column < 1 {
				t.Fatalf("rule %q at %s: no position", r.Rule.Name, r.Pos)
			}
		}
	})
}
