package replica

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestStoreFilterNeverHidesACopy is a property test of the stripes'
// filters: through random puts, takes and walks (which rebuild them) and
// growth past their size, every copy the Store holds is found by Has and
// Take, and a key it does not hold is never found.
func TestStoreFilterNeverHidesACopy(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			s := NewStore(0, nil)
			held := map[string]bool{}
			for step := range 6_000 {
				key := fmt.Sprint("k", rng.IntN(8_000))
				switch op := rng.IntN(200); {
				case op < 120:
					if !s.Put(copyOf("r", key, int64(step), 16)) {
						t.Fatalf("step %d: put %s refused", step, key)
					}
					held[key] = true
				case op < 199:
					_, ok := s.Take("r", key)
					if ok != held[key] {
						t.Fatalf("step %d: Take(%s) = %v, held %v", step, key, ok, held[key])
					}
					delete(held, key)
				default:
					s.Range(func(Copy) bool { return true })
				}
				if got := s.Has("r", key); got != held[key] {
					t.Fatalf("step %d: Has(%s) = %v, held %v", step, key, got, held[key])
				}
			}
			for key := range held {
				if !s.Has("r", key) {
					t.Fatalf("held copy %s not found", key)
				}
			}
			if int(s.Len()) != len(held) {
				t.Fatalf("Len %d, held %d", s.Len(), len(held))
			}
		})
	}
}

// TestStoreFilterGrows: stripes holding more keys than their first
// filter is sized for rebuild it bigger, and still find every copy.
func TestStoreFilterGrows(t *testing.T) {
	s := NewStore(0, nil)
	const n = 100_000 // about 1,560 a stripe, past the first filter's 512
	for i := range n {
		if !s.Put(copyOf("r", fmt.Sprint("k", i), 1, 16)) {
			t.Fatalf("put %d refused", i)
		}
	}
	grown := 0
	for i := range s.stripes {
		if len(s.stripes[i].filter.Load().words) > minFilterWords {
			grown++
		}
	}
	if grown == 0 {
		t.Fatal("no stripe's filter grew")
	}
	for i := range n {
		if !s.Has("r", fmt.Sprint("k", i)) {
			t.Fatalf("copy k%d not found", i)
		}
	}
	misses := 0
	for i := range n {
		if s.Has("r", fmt.Sprint("x", i)) {
			misses++
		}
	}
	if misses > 0 {
		t.Fatalf("%d keys never put were found", misses)
	}
}
