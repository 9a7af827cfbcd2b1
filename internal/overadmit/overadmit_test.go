package overadmit

import (
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/rule"
)

func TestBoundSumsNamedParts(t *testing.T) {
	c := &rule.Compiled{Rule: &rule.Rule{Name: "r"}}
	tests := []struct {
		name  string
		parts []Component
		want  int64
		names []string
	}{
		{"none", nil, 0, nil},
		{"one", []Component{Func{"fresh", func(*rule.Compiled, time.Time) int64 { return 100 }}}, 100, []string{"fresh"}},
		{"sum", []Component{
			Func{"fresh", func(*rule.Compiled, time.Time) int64 { return 100 }},
			Func{"debt", func(*rule.Compiled, time.Time) int64 { return 7 }},
			Func{"replication_lag", func(*rule.Compiled, time.Time) int64 { return 3 }},
		}, 110, []string{"fresh", "debt", "replication_lag"}},
		{"negative is clamped", []Component{
			Func{"fresh", func(*rule.Compiled, time.Time) int64 { return 5 }},
			Func{"bad", func(*rule.Compiled, time.Time) int64 { return -9 }},
		}, 5, []string{"fresh", "bad"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Bound
			for _, p := range tt.parts {
				b.Add(p)
			}
			if got := b.Permits(c, time.Unix(0, 0)); got != tt.want {
				t.Fatalf("Permits = %d, want %d", got, tt.want)
			}
			parts := b.Parts(c, time.Unix(0, 0))
			if len(parts) != len(tt.names) {
				t.Fatalf("Parts = %v, want names %v", parts, tt.names)
			}
			for i, p := range parts {
				if p.Name != tt.names[i] || p.Permits < 0 {
					t.Fatalf("part %d = %+v, want name %s and permits >= 0", i, p, tt.names[i])
				}
			}
		})
	}
}
