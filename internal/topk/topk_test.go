package topk

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	sec    = int64(time.Second)
	minute = int64(time.Minute)
)

func TestSpaceSaving(t *testing.T) {
	type add struct {
		key string
		w   int64
	}
	tests := []struct {
		name      string
		capacity  int
		adds      []add
		want      []Entry // hottest first
		wantFloor int64
	}{
		{"empty", 2, nil, nil, 0},
		{"below capacity counts exactly", 3, []add{{"a", 1}, {"b", 2}, {"a", 4}}, []Entry{{"a", 5, 0}, {"b", 2, 0}}, 0},
		{
			"a new key takes the smallest counter's place",
			2,
			[]add{{"a", 1}, {"b", 3}, {"c", 1}},
			[]Entry{{"b", 3, 0}, {"c", 2, 1}},
			2,
		},
		{
			"errors stack as keys churn",
			2,
			[]add{{"a", 1}, {"b", 3}, {"c", 1}, {"c", 5}, {"d", 1}},
			[]Entry{{"c", 7, 1}, {"d", 4, 3}},
			4,
		},
		{
			"capacity one keeps the last key with everything",
			1,
			[]add{{"a", 2}, {"b", 1}, {"c", 3}},
			[]Entry{{"c", 6, 3}},
			6,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s spaceSaving
			seed := maphash.MakeSeed()
			exact := map[string]int64{}
			var total int64
			for _, a := range tt.adds {
				s.add(maphash.String(seed, a.key), a.key, a.w, tt.capacity)
				s.check(t)
				exact[a.key] += a.w
				total += a.w
			}
			sum := s.summary(tt.capacity)
			if got := sum.Top(0); !slices.Equal(got, tt.want) {
				t.Errorf("entries %v, want %v", got, tt.want)
			}
			if sum.Floor != tt.wantFloor {
				t.Errorf("floor %d, want %d", sum.Floor, tt.wantFloor)
			}
			checkSummary(t, Merge(sum), exact, total, total/int64(tt.capacity))
		})
	}
}

// TestSpaceSavingCollisions drives the hash index with hashes that collide
// in full or in their low bits, so probing, eviction and backward-shift
// deletion all run, and checks the sketch's invariants after every add.
func TestSpaceSavingCollisions(t *testing.T) {
	hashes := []struct {
		name string
		h    func(key string) uint64
	}{
		{"all equal", func(string) uint64 { return 42 }},
		{"three values", func(k string) uint64 { return uint64(len(k) % 3) }},
		{"same low bits", func(k string) uint64 { return uint64(len(k)) << 32 }},
		{"maphash", func(k string) uint64 { return maphash.String(maphash.MakeSeed(), k) }},
	}
	for _, hh := range hashes {
		for _, capacity := range []int{1, 3, 8, 20} {
			t.Run(fmt.Sprint(hh.name, "/k=", capacity), func(t *testing.T) {
				seed := maphash.MakeSeed()
				hash := hh.h
				if hh.name == "maphash" {
					hash = func(k string) uint64 { return maphash.String(seed, k) }
				}
				r := rand.New(rand.NewPCG(uint64(capacity), 3))
				var s spaceSaving
				exact := map[string]int64{}
				var total int64
				for i := range 3000 {
					key := fmt.Sprint("k", r.IntN(50))
					if i%7 == 0 {
						key = fmt.Sprint("rare", i) // never seen twice: forces evictions
					}
					w := 1 + r.Int64N(4)
					s.add(hash(key), key, w, capacity)
					exact[key] += w
					total += w
					s.check(t)
					if i == 1500 {
						s.reset()
						s.check(t)
						exact, total = map[string]int64{}, 0
					}
				}
				checkSummary(t, Merge(s.summary(capacity)), exact, total, total/int64(capacity))
			})
		}
	}
}

// check verifies the sketch's internal invariants: counts sum to the
// total, the heap is ordered and each counter knows its position, and the
// table indexes every counter exactly once, findable from its hash.
func (s *spaceSaving) check(t *testing.T) {
	t.Helper()
	var sum int64
	for i, c := range s.counters {
		sum += c.count
		if int(s.heap[c.pos]) != i {
			t.Fatalf("counter %d (%q) says heap position %d, which holds %d", i, c.key, c.pos, s.heap[c.pos])
		}
		if p, ok := s.find(c.hash, c.key); !ok || int(s.table[p]) != i+1 {
			t.Fatalf("counter %d (%q) not found in the table", i, c.key)
		}
	}
	if sum != s.total {
		t.Fatalf("counts sum to %d, total is %d", sum, s.total)
	}
	for j := 1; j < len(s.heap); j++ {
		if s.less(j, (j-1)/2) {
			t.Fatalf("heap out of order at %d", j)
		}
	}
	used := 0
	for _, v := range s.table {
		if v != 0 {
			used++
		}
	}
	if used != len(s.counters) || len(s.heap) != len(s.counters) {
		t.Fatalf("table holds %d, heap %d, counters %d", used, len(s.heap), len(s.counters))
	}
	if len(s.counters) > 0 && 2*len(s.counters) > len(s.table) {
		t.Fatalf("table %d more than half full with %d", len(s.table), len(s.counters))
	}
}

func TestSketchWindows(t *testing.T) {
	cfg := Config{Capacity: 4, MinuteBucket: 10 * time.Second, HourBucket: 5 * time.Minute}
	// A step observes when want is nil and reads Top(at, w, denied, 0)
	// otherwise.
	type step struct {
		at      int64
		key     string
		permits int64
		denied  bool
		w       Window
		want    []Entry
	}
	none := []Entry{}
	tests := []struct {
		name  string
		steps []step
	}{
		{"admitted and denied are apart", []step{
			{at: 0, key: "a", permits: 5},
			{at: 1, key: "b", permits: 1, denied: true},
			{at: 2, key: "a", permits: 2, denied: true},
			{at: 0, w: Minute, want: []Entry{{"a", 5, 0}}},
			{at: 0, w: Minute, denied: true, want: []Entry{{"a", 2, 0}, {"b", 1, 0}}},
			{at: 0, w: Hour, want: []Entry{{"a", 5, 0}}},
		}},
		{"peeks and negative permits count nothing", []step{
			{at: 0, key: "a", permits: 0},
			{at: 0, key: "b", permits: -3},
			{at: 0, w: Minute, want: none},
		}},
		{"the minute keeps 60 to 70 seconds", []step{
			{at: 0, key: "a", permits: 1},
			{at: 15 * sec, key: "b", permits: 1},
			{at: 69*sec + 999, w: Minute, want: []Entry{{"a", 1, 0}, {"b", 1, 0}}},
			{at: 70 * sec, w: Minute, want: []Entry{{"b", 1, 0}}},
			{at: 80 * sec, w: Minute, want: none},
			{at: 80 * sec, w: Hour, want: []Entry{{"a", 1, 0}, {"b", 1, 0}}},
		}},
		{"the hour keeps 60 to 65 minutes", []step{
			{at: 0, key: "a", permits: 3},
			{at: 64*minute + 59*sec, w: Hour, want: []Entry{{"a", 3, 0}}},
			{at: 65 * minute, w: Hour, want: none},
		}},
		{"a bucket from an earlier lap is emptied before reuse", []step{
			{at: 0, key: "a", permits: 5},
			{at: 70 * sec, key: "b", permits: 1}, // same minute slot as 0
			{at: 70 * sec, w: Minute, want: []Entry{{"b", 1, 0}}},
			{at: 70 * sec, w: Hour, want: []Entry{{"a", 5, 0}, {"b", 1, 0}}},
			{at: 2 * time.Hour.Nanoseconds(), key: "c", permits: 2},
			{at: 2 * time.Hour.Nanoseconds(), w: Hour, want: []Entry{{"c", 2, 0}}},
		}},
		{"ten idle minutes empty the minute, not the hour", []step{
			{at: 0, key: "a", permits: 1},
			{at: 10 * minute, w: Minute, want: none},
			{at: 10 * minute, w: Hour, want: []Entry{{"a", 1, 0}}},
		}},
		{"a clock going back counts in the latest bucket", []step{
			{at: 100 * sec, key: "a", permits: 1},
			{at: 50 * sec, key: "a", permits: 2},
			{at: 0, key: "b", permits: 1},
			// Reads at an earlier time read at the latest.
			{at: 0, w: Minute, want: []Entry{{"a", 3, 0}, {"b", 1, 0}}},
			{at: 169 * sec, w: Minute, want: []Entry{{"a", 3, 0}, {"b", 1, 0}}},
			{at: 170 * sec, w: Minute, want: none},
		}},
		{"negative monotonic times", []step{
			{at: -1, key: "a", permits: 1},
			{at: 0, key: "b", permits: 1},
			// -1 is in the bucket [-10 s, 0), which leaves at 60 s.
			{at: 59 * sec, w: Minute, want: []Entry{{"a", 1, 0}, {"b", 1, 0}}},
			{at: 60 * sec, w: Minute, want: []Entry{{"b", 1, 0}}},
			{at: 70 * sec, w: Minute, want: none},
		}},
		{"an unknown window reads nothing", []step{
			{at: 0, key: "a", permits: 1},
			{at: 0, w: Window(9), want: none},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tt.steps {
				if st.want == nil {
					s.Observe(st.at, st.key, st.permits, st.denied)
					continue
				}
				got := s.Top(st.at, st.w, st.denied, 0)
				if len(got) == 0 && len(st.want) == 0 {
					continue
				}
				if !slices.Equal(got, st.want) {
					t.Errorf("step %d: Top(%d, %v, denied=%v) = %v, want %v", i, st.at, st.w, st.denied, got, st.want)
				}
			}
		})
	}
}

func TestTopN(t *testing.T) {
	s, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		s.Observe(0, fmt.Sprint("k", i), int64(i+1), false)
	}
	got := s.Top(0, Minute, false, 3)
	want := []Entry{{"k9", 10, 0}, {"k8", 9, 0}, {"k7", 8, 0}}
	if !slices.Equal(got, want) {
		t.Errorf("Top(3) = %v, want %v", got, want)
	}
	if got := s.Top(0, Minute, false, 0); len(got) != 10 {
		t.Errorf("Top(0) has %d entries, want all 10", len(got))
	}
}

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	tests := []struct {
		name  string
		edit  func(*Config)
		field string // "" for valid
	}{
		{"default", func(*Config) {}, ""},
		{"capacity one", func(c *Config) { c.Capacity = 1 }, ""},
		{"zero capacity", func(c *Config) { c.Capacity = 0 }, "Capacity"},
		{"capacity too large", func(c *Config) { c.Capacity = MaxCapacity + 1 }, "Capacity"},
		{"zero minute bucket", func(c *Config) { c.MinuteBucket = 0 }, "MinuteBucket"},
		{"minute bucket not dividing", func(c *Config) { c.MinuteBucket = 7 * time.Second }, "MinuteBucket"},
		{"minute bucket longer than a minute", func(c *Config) { c.MinuteBucket = 2 * time.Minute }, "MinuteBucket"},
		{"smallest buckets", func(c *Config) { c.MinuteBucket, c.HourBucket = time.Second, time.Minute }, ""},
		{"minute bucket below a second", func(c *Config) { c.MinuteBucket = 500 * time.Millisecond }, "MinuteBucket"},
		{"hour bucket below a minute", func(c *Config) { c.HourBucket = 30 * time.Second }, "HourBucket"},
		{"hour bucket not dividing", func(c *Config) { c.HourBucket = 7 * time.Minute }, "HourBucket"},
		{"negative hour bucket", func(c *Config) { c.HourBucket = -time.Minute }, "HourBucket"},
		{"sampling", func(c *Config) { c.SampleEvery, c.ExactPerBucket = 16, 1000 }, ""},
		{"sample every one", func(c *Config) { c.SampleEvery = 1 }, ""},
		{"sample every not a power of two", func(c *Config) { c.SampleEvery = 12 }, "SampleEvery"},
		{"sample every too large", func(c *Config) { c.SampleEvery = 2 * MaxSampleEvery }, "SampleEvery"},
		{"negative sample every", func(c *Config) { c.SampleEvery = -2 }, "SampleEvery"},
		{"negative exact per bucket", func(c *Config) { c.ExactPerBucket = -1 }, "ExactPerBucket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.edit(&c)
			err := c.Validate()
			_, newErr := New(c)
			switch {
			case tt.field == "" && (err != nil || newErr != nil):
				t.Errorf("Validate = %v, New = %v; want both nil", err, newErr)
			case tt.field != "" && (!errors.Is(err, ErrInvalidConfig) || !errors.Is(newErr, ErrInvalidConfig)):
				t.Errorf("Validate = %v, New = %v; want ErrInvalidConfig", err, newErr)
			case tt.field != "" && !strings.Contains(err.Error(), tt.field):
				t.Errorf("Validate = %v; want it to name %s", err, tt.field)
			}
		})
	}
	if got := ok.MaxEntries(); got != 256*(7+13)*2 {
		t.Errorf("default MaxEntries = %d, want %d", got, 256*(7+13)*2)
	}
}

func TestMerge(t *testing.T) {
	a := Summary{Entries: []Entry{{"x", 10, 2}, {"y", 5, 0}}, Floor: 4, Total: 30}
	b := Summary{Entries: []Entry{{"x", 7, 0}, {"z", 6, 3}}, Floor: 3, Total: 20}
	c := Summary{Entries: []Entry{{"w", 1, 0}}, Floor: 0, Total: 1} // not full
	got := Merge(a, b, c)
	want := Summary{
		// x: 10+7 (+0 for c), error 2+0; y: 5 + b's floor 3; z: 6 + a's
		// floor 4; w: 1 + 4 + 3. Ties go by key.
		Entries: []Entry{{"x", 17, 2}, {"z", 10, 7}, {"w", 8, 7}, {"y", 8, 3}},
		Floor:   7,
		Total:   51,
	}
	if !slices.Equal(got.Entries, want.Entries) || got.Floor != want.Floor || got.Total != want.Total {
		t.Errorf("Merge = %+v, want %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("merged summary invalid: %v", err)
	}
	if a.Entries[0] != (Entry{"x", 10, 2}) {
		t.Errorf("Merge modified its input: %+v", a)
	}
	if got := Merge(); len(got.Entries) != 0 || got.Floor != 0 || got.Total != 0 {
		t.Errorf("Merge() = %+v, want empty", got)
	}

	tr := got.Truncate(2)
	if !slices.Equal(tr.Entries, want.Entries[:2]) || tr.Floor != 8 || tr.Total != 51 {
		t.Errorf("Truncate(2) = %+v, want the first two entries and floor 8", tr)
	}
	if len(got.Entries) != 4 {
		t.Errorf("Truncate modified its receiver")
	}
	if tr := got.Truncate(0); len(tr.Entries) != 4 || tr.Floor != 7 {
		t.Errorf("Truncate(0) = %+v, want unchanged", tr)
	}
}

func TestSummaryValidate(t *testing.T) {
	tests := []struct {
		name string
		s    Summary
		ok   bool
	}{
		{"empty", Summary{}, true},
		{"good", Summary{Entries: []Entry{{"a", 5, 2}}, Floor: 2, Total: 9}, true},
		{"duplicate key", Summary{Entries: []Entry{{"a", 1, 0}, {"a", 1, 0}}, Total: 2}, false},
		{"negative floor", Summary{Floor: -1}, false},
		{"floor above total", Summary{Floor: 3, Total: 2}, false},
		{"error above floor", Summary{Entries: []Entry{{"a", 5, 3}}, Floor: 2, Total: 9}, false},
		{"negative error", Summary{Entries: []Entry{{"a", 5, -1}}, Floor: 2, Total: 9}, false},
		{"count below error", Summary{Entries: []Entry{{"a", 1, 2}}, Floor: 2, Total: 9}, false},
		{"count above total", Summary{Entries: []Entry{{"a", 10, 0}}, Total: 9}, false},
	}
	for _, tt := range tests {
		err := tt.s.Validate()
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidSummary)) {
			t.Errorf("%s: Validate = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

// zipfStream returns n observations of keys drawn from Zipf(s=1.1) over
// universe keys, spread evenly over span nanoseconds from start, with
// permits 1 to 3 and about one in four denied.
func zipfStream(seed uint64, n int, universe uint64, start, span int64) []obs {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	z := rand.NewZipf(r, 1.1, 1, universe-1)
	out := make([]obs, n)
	for i := range out {
		out[i] = obs{
			at:      start + span*int64(i)/int64(n),
			key:     fmt.Sprintf("user-%07d", z.Uint64()),
			permits: 1 + r.Int64N(3),
			denied:  r.IntN(4) == 0,
		}
	}
	return out
}

type obs struct {
	at      int64
	key     string
	permits int64
	denied  bool
}

// TestZipfProperty: on Zipf(1.1) streams, for each window and side, every
// key whose true count exceeds N/k is reported, every reported count c
// satisfies true ≤ c ≤ true + error, and the floor (the largest error)
// is at most N/k; also after merging three nodes and after truncating.
func TestZipfProperty(t *testing.T) {
	cfg := Config{Capacity: 32, MinuteBucket: 10 * time.Second, HourBucket: 5 * time.Minute}
	k := int64(cfg.Capacity)
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			const nodes = 3
			var snaps [2][2][]Summary // [window][side] per node
			var models []*model
			end := int64(0)
			for node := range uint64(nodes) {
				s, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				m := newModel(cfg)
				// 20,000 decisions over 70 minutes: the hour window drops
				// the first buckets, the minute sees the last 70 s.
				stream := zipfStream(seed*nodes+node, 20000, 10000, 0, 70*minute)
				for _, o := range stream {
					s.Observe(o.at, o.key, o.permits, o.denied)
					m.observe(o.at, o.key, o.permits, o.denied)
				}
				models = append(models, m)
				end = stream[len(stream)-1].at
				for wi, w := range []Window{Minute, Hour} {
					for side, denied := range []bool{false, true} {
						snap := s.Snapshot(end, w, denied)
						exact, total := m.exact(end, w, denied)
						if total == 0 {
							t.Fatalf("%v denied=%v: empty window, the test proves nothing", w, denied)
						}
						checkSummary(t, snap, exact, total, total/k)
						snaps[wi][side] = append(snaps[wi][side], snap)
					}
				}
			}
			for wi, w := range []Window{Minute, Hour} {
				for side, denied := range []bool{false, true} {
					// Each node has its own clock: the truth is the sum.
					exact, total := map[string]int64{}, int64(0)
					for _, m := range models {
						e, n := m.exact(end, w, denied)
						for k, c := range e {
							exact[k] += c
						}
						total += n
					}
					merged := Merge(snaps[wi][side]...)
					checkSummary(t, merged, exact, total, total/k)
					// Truncated for the wire: still sound, floor may rise.
					checkSummary(t, merged.Truncate(int(k)), exact, total, -1)
				}
			}
		})
	}
}

// TestConcurrentObserve checks that no permit is lost under contention (run
// with -race): totals are exact even where keys are not.
func TestConcurrentObserve(t *testing.T) {
	s, err := New(Config{Capacity: 8, MinuteBucket: 10 * time.Second, HourBucket: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 4, 2000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				s.Observe(int64(i)*1000, fmt.Sprint("k", (i*w)%20), 1, i%5 == 0)
			}
		})
	}
	wg.Go(func() {
		for range 100 {
			s.Top(0, Hour, false, 5)
		}
	})
	wg.Wait()
	adm, den := s.Snapshot(0, Hour, false), s.Snapshot(0, Hour, true)
	if adm.Total+den.Total != workers*each || den.Total != workers*each/5 {
		t.Errorf("totals admitted %d + denied %d, want %d with %d denied", adm.Total, den.Total, workers*each, workers*each/5)
	}
}
