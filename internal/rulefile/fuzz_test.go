package rulefile

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tokenserver/tokenserver/internal/rulepb"
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

// FuzzRoundTripRule: a rule drawn from the fuzzer's seed, if valid,
// reads back from its JSON form unchanged, the cost fields included.
func FuzzRoundTripRule(f *testing.F) {
	for _, s := range []uint64{1, 17, 2026, 1 << 40} {
		f.Add(s, s>>1)
	}
	f.Fuzz(func(t *testing.T, a, b uint64) {
		want, durable := randomRule(rand.New(rand.NewPCG(a, b)))
		n := want.Clone()
		n.Normalize()
		if n.Validate() != nil {
			return
		}
		p := rulepb.ToProto(want)
		p.Durable = durable
		js, err := protojson.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := Parse("r.json", js)
		if err != nil || len(rs) != 1 || !reflect.DeepEqual(rs[0].Rule, want) || rs[0].Durable != durable {
			t.Fatalf("%s read back as %+v, %v; want %+v", js, rs, err, want)
		}
	})
}
