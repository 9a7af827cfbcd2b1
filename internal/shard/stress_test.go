package shard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// TestStressChurn runs acquires and refills (each refill tried twice, as a
// client retry) from many goroutines, some holding an older table for a
// while, against a sweeper that never stops and a writer that changes and
// re-creates the rules meanwhile. Per key and rule generation, granted
// minus refilled never exceeds what the rule allows over the test's span
// (its capacity plus what refills in that fake time), no grant gives back
// more than it took, and max_keys holds.
func TestStressChurn(t *testing.T) {
	const (
		keys    = 40
		workers = 6
		ops     = 3000
		limit   = 5
		maxKeys = 30
	)
	rules := []*rule.Rule{
		{Name: "tb", Algorithm: bucket.TokenBucket, Limit: limit, Period: time.Hour},
		{Name: "log", Algorithm: bucket.SlidingLog, Limit: limit, Period: time.Hour, MaxKeys: maxKeys},
		{Name: "fw", Algorithm: bucket.FixedWindow, Limit: limit, Period: time.Hour},
	}
	s, _ := store(t, rules...)
	m := New(Config{Shards: 4})
	var clock atomic.Int64
	start := 100 * sec
	clock.Store(start) // each op moves it 1µs: the test spans a few ms of fake time

	type genKey struct {
		gen uint64
		key string
	}
	var mu sync.Mutex
	net := map[genKey]int64{} // granted - refilled

	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { // sweeper: never stops, with whatever table it loaded
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				t := s.Table()
				m.Sweep(clock.Load(), t)
			}
		}
	}()
	go func() { // writer: changes (same generation) and re-creates rules
		defer bg.Done()
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r := rules[i%len(rules)].Clone()
			if i%2 == 0 {
				r.Fallback = rule.Fallback{Policy: rule.FallbackDeny} // a new version, same generation
				if _, err := s.Put(ctx, r, nil); err != nil {
					panic(err)
				}
			} else {
				_ = s.Delete(ctx, r.Name, nil)
				if _, err := s.Put(ctx, r, nil); err != nil {
					panic(err)
				}
			}
		}
	}()

	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			tab := s.Table()
			for i := 0; i < ops; i++ {
				if rng.IntN(8) == 0 {
					tab = s.Table() // others keep an older table for a while
				}
				c := tab.Get(rules[rng.IntN(len(rules))].Name)
				if c == nil {
					continue // deleted in this table
				}
				key := fmt.Sprint("k", rng.IntN(keys))
				now := clock.Add(int64(time.Microsecond))
				d, err := m.Acquire(c, key, bucket.Request{Permits: 1 + rng.Int64N(2)}, now)
				if err != nil {
					continue // max_keys
				}
				if d.Granted == 0 {
					continue
				}
				gk := genKey{d.Rule.Rule.Generation, c.Rule.Name + "/" + key}
				mu.Lock()
				net[gk] += d.Granted
				mu.Unlock()
				if rng.IntN(3) == 0 {
					id := d.Grant.String()
					var back int64
					for range 2 { // a retried refill must change nothing
						n, _, err := m.Refill(c, key, id, -1, clock.Add(int64(time.Microsecond)))
						if errors.Is(err, rule.ErrNotFound) {
							break // deleted meanwhile
						}
						if err != nil {
							t.Error(err)
							return
						}
						back += n
					}
					if back > d.Granted {
						t.Errorf("grant of %d gave back %d", d.Granted, back)
					}
					mu.Lock()
					net[gk] -= back
					mu.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	bg.Wait()

	span := time.Duration(clock.Load() - start)
	allowed := int64(limit) + int64(float64(limit)*span.Hours()) // capacity + whole permits refilled in the span
	for gk, n := range net {
		if n > allowed {
			t.Errorf("%s generation %d: granted - refilled = %d, above %d", gk.key, gk.gen, n, allowed)
		}
	}
	if c := s.Table().Get("log"); c != nil && m.KeyCount(c) > maxKeys {
		t.Errorf("log holds %d keys, above max_keys %d", m.KeyCount(c), maxKeys)
	}
	if n := m.Sweep(clock.Load()+int64(2*time.Hour), s.Table()); m.Live() != 0 || m.Bytes() != 0 || m.active.Load() != 0 {
		t.Errorf("after a final sweep (%d dropped): live %d, bytes %d, rules holding bytes %d; want 0 (accounting drifted)", n, m.Live(), m.Bytes(), m.active.Load())
	}
	t.Logf("%d (key, generation) pairs, fake span %v, %d evicted", len(net), span, m.Evicted())
}
