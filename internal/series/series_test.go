package series

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"
)

const sec = int64(time.Second)

// add is one Add call at a fake time.
type add struct {
	at                                      int64
	admitted, denied, shadowDenied, permits int64
}

// span is one Range call and the non-zero seconds it must return; every
// other second of the range must read as zeros.
type span struct {
	now, from, to int64
	len           int             // points expected
	want          map[int64]Point // by second, Time filled in by the test
}

func run(t *testing.T, adds []add, spans []span) {
	t.Helper()
	var s Series
	for _, a := range adds {
		s.Add(a.at, a.admitted, a.denied, a.shadowDenied, a.permits)
	}
	for i, sp := range spans {
		got := s.Range(sp.now, sp.from, sp.to)
		if len(got) != sp.len {
			t.Fatalf("span %d: got %d points, want %d", i, len(got), sp.len)
		}
		for j, p := range got {
			if j > 0 && p.Time != got[j-1].Time+sec {
				t.Fatalf("span %d: point %d at %d does not follow %d", i, j, p.Time, got[j-1].Time)
			}
			want := sp.want[p.Time/sec]
			want.Time = p.Time
			if p != want {
				t.Errorf("span %d: second %d = %+v, want %+v", i, p.Time/sec, p, want)
			}
		}
	}
}

func TestRange(t *testing.T) {
	t0 := 1000 * sec
	tests := []struct {
		name  string
		adds  []add
		spans []span
	}{
		{
			name: "empty series reads zeros",
			spans: []span{
				{now: t0, from: t0 - 9*sec, to: t0, len: 10},
			},
		},
		{
			name: "adds within a second sum",
			adds: []add{
				{t0, 1, 0, 0, 3},
				{t0 + sec/2, 1, 1, 0, 2},
				{t0 + sec - 1, 0, 0, 1, 0},
				{t0 + sec, 1, 0, 0, 1},
			},
			spans: []span{
				{now: t0 + sec, from: t0 - sec, to: t0 + sec, len: 3, want: map[int64]Point{
					1000: {Admitted: 2, Denied: 1, ShadowDenied: 1, Permits: 5},
					1001: {Admitted: 1, Permits: 1},
				}},
			},
		},
		{
			name: "ten idle minutes read as zeros, not stale values",
			adds: []add{
				{t0, 5, 0, 0, 5},
				{t0 + 600*sec, 1, 0, 0, 1},
			},
			spans: []span{
				{now: t0 + 600*sec, from: t0, to: t0 + 600*sec, len: 601, want: map[int64]Point{
					1000: {Admitted: 5, Permits: 5},
					1600: {Admitted: 1, Permits: 1},
				}},
			},
		},
		{
			name: "a slot from the previous lap reads as zero",
			adds: []add{
				{t0, 5, 0, 0, 5},
				{t0 + 3599*sec, 1, 0, 0, 1},
			},
			spans: []span{
				// Second 1000 is still inside the hour ending at 4599.
				{now: t0 + 3599*sec, from: t0, to: t0, len: 1, want: map[int64]Point{
					1000: {Admitted: 5, Permits: 5},
				}},
				// One second later it has left; its slot now stands for 4600.
				{now: t0 + 3600*sec, from: 0, to: t0 + 3600*sec, len: 3600, want: map[int64]Point{
					4599: {Admitted: 1, Permits: 1},
				}},
			},
		},
		{
			name: "after more than an hour idle everything reads as zero",
			adds: []add{
				{t0, 5, 0, 0, 5},
			},
			spans: []span{
				{now: t0 + 2*3600*sec, from: t0 + 3600*sec, to: t0 + 2*3600*sec, len: 3600},
			},
		},
		{
			name: "a clock going backwards counts in the latest second",
			adds: []add{
				{t0 + 10*sec, 1, 0, 0, 1},
				{t0, 0, 1, 0, 0},         // 10 s back
				{t0 + 5*sec, 0, 0, 1, 0}, // still behind
				{t0 + 11*sec, 1, 0, 0, 4},
			},
			spans: []span{
				{now: t0 + 11*sec, from: t0, to: t0 + 11*sec, len: 12, want: map[int64]Point{
					1010: {Admitted: 1, Denied: 1, ShadowDenied: 1, Permits: 1},
					1011: {Admitted: 1, Permits: 4},
				}},
				// A read with an earlier now still sees up to the latest second.
				{now: t0, from: t0 + 11*sec, to: t0 + 11*sec, len: 1, want: map[int64]Point{
					1011: {Admitted: 1, Permits: 4},
				}},
			},
		},
		{
			name: "range is clipped to the last hour and to now",
			adds: []add{
				{t0, 1, 0, 0, 1},
			},
			spans: []span{
				{now: t0, from: t0 - 2*3600*sec, to: t0 + 100*sec, len: 3600, want: map[int64]Point{
					1000: {Admitted: 1, Permits: 1},
				}},
				{now: t0, from: t0 + sec, to: t0 + 100*sec, len: 0},
				{now: t0, from: t0, to: t0 - sec, len: 0},
			},
		},
		{
			name: "negative monotonic times bucket by floor",
			adds: []add{
				{-1, 1, 0, 0, 1},
				{-sec, 1, 0, 0, 1},
				{0, 0, 1, 0, 0},
			},
			spans: []span{
				{now: 0, from: -2 * sec, to: 0, len: 3, want: map[int64]Point{
					-1: {Admitted: 2, Permits: 2},
					0:  {Denied: 1},
				}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.adds, tt.spans) })
	}
}

func TestUtilisation(t *testing.T) {
	tests := []struct {
		permits, limit int64
		period         time.Duration
		want           float64
	}{
		{50, 100, time.Second, 0.5},
		{1, 60, time.Minute, 1},
		{30, 3600, time.Hour, 30},
		{10, 100, 100 * time.Millisecond, 0.01},
		{10, 0, time.Second, 0},
		{10, 100, 0, 0},
	}
	for _, tt := range tests {
		got := Point{Permits: tt.permits}.Utilisation(tt.limit, tt.period)
		if math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("Utilisation(%d permits, %d per %v) = %v, want %v", tt.permits, tt.limit, tt.period, got, tt.want)
		}
	}
}

func TestMerge(t *testing.T) {
	a := []Point{{Time: 1 * sec, Admitted: 1, Permits: 1}, {Time: 2 * sec, Denied: 2}}
	b := []Point{{Time: 2 * sec, Admitted: 3, Permits: 6}, {Time: 3 * sec, ShadowDenied: 1}}
	c := []Point{{Time: 0, Admitted: 1}, {Time: 2 * sec, ShadowDenied: 4}}
	aCopy := slices.Clone(a)
	got := Merge(a, b, c)
	want := []Point{
		{Time: 0, Admitted: 1},
		{Time: 1 * sec, Admitted: 1, Permits: 1},
		{Time: 2 * sec, Admitted: 3, Denied: 2, ShadowDenied: 4, Permits: 6},
		{Time: 3 * sec, ShadowDenied: 1},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Merge = %+v, want %+v", got, want)
	}
	if !slices.Equal(a, aCopy) {
		t.Errorf("Merge modified its input: %+v", a)
	}
	if got := Merge(); len(got) != 0 {
		t.Errorf("Merge() = %+v, want empty", got)
	}
}

// TestMergeOfRanges is the cross-node read: each node's Range, merged.
func TestMergeOfRanges(t *testing.T) {
	var n1, n2 Series
	t0 := 50 * sec
	n1.Add(t0, 1, 0, 0, 1)
	n2.Add(t0, 0, 1, 0, 0)
	n2.Add(t0+sec, 2, 0, 0, 2)
	got := Merge(n1.Range(t0+sec, t0, t0+sec), n2.Range(t0+sec, t0, t0+sec))
	want := []Point{
		{Time: t0, Admitted: 1, Denied: 1, Permits: 1},
		{Time: t0 + sec, Admitted: 2, Permits: 2},
	}
	if !slices.Equal(got, want) {
		t.Errorf("merged = %+v, want %+v", got, want)
	}
}

func TestSlotBytes(t *testing.T) {
	if got := unsafe.Sizeof(slot{}); got != SlotBytes {
		t.Errorf("slot is %d bytes, SlotBytes says %d", got, SlotBytes)
	}
}

// TestConcurrentAdd checks that no addition is lost under contention (run
// with -race).
func TestConcurrentAdd(t *testing.T) {
	var s Series
	const workers, each = 4, 1000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				s.Add(int64(i%3)*sec, 1, int64(w%2), 0, 2)
			}
		})
	}
	wg.Wait()
	var total Point
	for _, p := range s.Range(2*sec, 0, 2*sec) {
		total.Admitted += p.Admitted
		total.Denied += p.Denied
		total.Permits += p.Permits
	}
	// Adds at an earlier second after a later one count in the later one,
	// so only the totals are fixed.
	if total.Admitted != workers*each || total.Denied != 2*each || total.Permits != 2*workers*each {
		t.Errorf("totals %+v after %d adds", total, workers*each)
	}
}

// FuzzSeries checks Range against an exact model: each Add lands in the
// second of max(now, latest), and Range returns exactly the model's counts
// for the visible hour.
func FuzzSeries(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 200, 5, 255, 255, 1})
	f.Add([]byte{9, 9, 9, 0, 0, 0, 128, 64, 32})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var s Series
		model := map[int64]Point{}
		now := int64(0)
		latest := int64(math.MinInt64)
		for i := 0; i+2 < len(ops); i += 3 {
			// Steps from -64 s to +191 s at millisecond grain: clocks go
			// both ways and gaps pass the hour.
			step := (int64(ops[i]) - 64) * sec
			if ops[i] == 255 {
				step = 3500 * sec
			}
			now += step + int64(ops[i+1])*int64(time.Millisecond)
			a, d := int64(ops[i+2]&3), int64(ops[i+2]>>2&3)
			s.Add(now, a, d, int64(ops[i+2]>>4&1), a*2)
			latest = max(latest, secondOf(now))
			p := model[latest]
			p.Admitted += a
			p.Denied += d
			p.ShadowDenied += int64(ops[i+2] >> 4 & 1)
			p.Permits += a * 2
			model[latest] = p
		}
		end := max(latest, secondOf(now))
		got := s.Range(now, (end-Slots-10)*sec, (end+10)*sec)
		if len(got) != Slots {
			t.Fatalf("got %d points for a range covering the hour, want %d", len(got), Slots)
		}
		for _, p := range got {
			want := model[p.Time/sec]
			want.Time = p.Time
			if p != want {
				t.Fatalf("second %d = %+v, want %+v", p.Time/sec, p, want)
			}
		}
		if got[len(got)-1].Time != end*sec {
			t.Fatalf("last point at %d, want %d", got[len(got)-1].Time/sec, end)
		}
	})
}

// BenchmarkAdd is one decision's cost on the decision path.
func BenchmarkAdd(b *testing.B) {
	var s Series
	now := int64(0)
	b.ReportAllocs()
	cpu := cpuNanos()
	for b.Loop() {
		now += 100 * int64(time.Microsecond)
		s.Add(now, 1, 0, 0, 1)
	}
	reportCPU(b, cpu)
}

// BenchmarkAddParallel is Add from every core on one rule's Series.
func BenchmarkAddParallel(b *testing.B) {
	var s Series
	b.ReportAllocs()
	cpu := cpuNanos()
	b.RunParallel(func(pb *testing.PB) {
		now := int64(0)
		for pb.Next() {
			now += 100 * int64(time.Microsecond)
			s.Add(now, 1, 0, 0, 1)
		}
	})
	reportCPU(b, cpu)
}

// BenchmarkRangeHour is the read of a full hour.
func BenchmarkRangeHour(b *testing.B) {
	var s Series
	for i := range int64(Slots) {
		s.Add(i*sec, 1, 0, 0, 1)
	}
	b.ReportAllocs()
	cpu := cpuNanos()
	for b.Loop() {
		s.Range(Slots*sec, 0, Slots*sec)
	}
	reportCPU(b, cpu)
}

// TestSums: Sums equals Range's points summed in buckets of the width,
// for ranges inside, across and outside the hour, including an empty
// series and a range starting before the ring's oldest second.
func TestSums(t *testing.T) {
	var s Series
	r := rand.New(rand.NewPCG(3, 4))
	now := int64(5000) * sec
	for range 20000 {
		at := now - r.Int64N(2*int64(Slots))*sec // half of them older than the hour
		s.Add(max(at, 0), r.Int64N(3), r.Int64N(2), r.Int64N(2), r.Int64N(5))
	}
	s.Add(now, 1, 0, 0, 1)
	tests := []struct {
		name     string
		from, to int64
		width    int64
	}{
		{"the last 10 s in one", now - 9*sec, now, 10},
		{"the hour by minute", now - 3599*sec, now, 60},
		{"the hour by second", now - 3599*sec, now, 1},
		{"two hours by 7 s, cut short", now - 7199*sec, now, 7},
		{"the future", now + sec, now + 100*sec, 10},
		{"one second", now, now, 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := s.Sums(now, tt.from, tt.to, tt.width)
			want := make([]Point, (tt.to-tt.from)/sec/tt.width+1)
			for i := range want {
				want[i].Time = tt.from + int64(i)*tt.width*sec
			}
			for _, p := range s.Range(now, tt.from, tt.to) {
				w := &want[(p.Time-tt.from)/sec/tt.width]
				w.Admitted += p.Admitted
				w.Denied += p.Denied
				w.ShadowDenied += p.ShadowDenied
				w.Permits += p.Permits
			}
			if !slices.Equal(got, want) {
				t.Fatalf("Sums:\n%v\nwant:\n%v", got, want)
			}
		})
	}
	var empty Series
	if got := empty.Sums(now, now-59*sec, now, 60); len(got) != 1 || got[0] != (Point{Time: now - 59*sec}) {
		t.Fatalf("empty series: %v", got)
	}
	if got := s.Sums(now, now, now-sec, 1); got != nil {
		t.Fatalf("from after to: %v", got)
	}
}
