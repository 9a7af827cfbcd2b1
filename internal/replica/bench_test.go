package replica

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
)

// benchKeys is the figure's scale: 1M durable keys.
const benchKeys = 1_000_000

// loaded returns a node holding n durable buckets (each acquired once)
// and their keys.
func loaded(b *testing.B, n int) (*node, *rule.Compiled, []string) {
	b.Helper()
	tbl := table(&rule.Rule{Name: "quota", Algorithm: bucket.TokenBucket, Limit: 1000, Period: time.Hour, Durable: true})
	view := cluster.NewView(1, []cluster.Member{{ID: "a"}, {ID: "b"}})
	a := newNode("a", tbl, view, 1e15, true)
	c := tbl.Get("quota")
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%07d", i)
		if _, err := a.m.Acquire(c, keys[i], bucket.Request{Permits: 1}, a.now); err != nil {
			b.Fatal(err)
		}
	}
	return a, c, keys
}

// BenchmarkReplicateEncodeApply is one replication of 1M changed durable
// buckets without the network: the sender takes the dirty set (the
// buckets its decisions marked), exports each bucket and encodes batches
// of BatchBuckets; the receiver decodes
// them and stores the copies. ns/key is the CPU per changed key (both
// sides), B/key the bytes on the wire.
func BenchmarkReplicateEncodeApply(b *testing.B) {
	a, c, keys := loaded(b, benchKeys)
	recv := newNode("b", nil, nil, 7e12, true)
	b.ReportAllocs()
	b.ResetTimer()
	var wire, cpu int64
	for range b.N {
		b.StopTimer()
		for _, k := range keys { // a decision marks each bucket
			if _, err := a.m.Acquire(c, k, bucket.Request{}, a.now); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		start := cpuNanos()
		tk := a.r.Tracker.Take()
		if len(tk.Marked) != benchKeys {
			b.Fatalf("%d buckets marked, want %d", len(tk.Marked), benchKeys)
		}
		buf := a.r.sendBufs.Get().(*sendBuf)
		for o := (outgoing{marked: tk.Marked}); o.len() > 0; {
			before := o.len()
			states, err := a.r.exportBatch(buf, &o, a.now)
			if err != nil || len(states) != before-o.len() {
				b.Fatal(len(states), before-o.len(), err)
			}
			buf.batch = peerv1.ReplicaBatch{From: "a", SenderNowNs: a.now, Buckets: states}
			out, err := proto.Marshal(&buf.batch)
			if err != nil {
				b.Fatal(err)
			}
			wire += int64(len(out))
			var got peerv1.ReplicaBatch
			if err := proto.Unmarshal(out, &got); err != nil {
				b.Fatal(err)
			}
			if _, err := recv.r.storeBatch(&got, recv.now); err != nil {
				b.Fatal(err)
			}
		}
		a.r.sendBufs.Put(buf)
		a.r.Tracker.Ack(tk)
		cpu += cpuNanos() - start
	}
	b.ReportMetric(float64(cpu)/float64(b.N*benchKeys), "cpu-ns/key")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchKeys), "ns/key")
	b.ReportMetric(float64(wire)/float64(b.N*benchKeys), "B/key")
}

// BenchmarkCheckpoint writes a checkpoint of 1M durable buckets (temp
// file, one fsync, rename), then reads it back.
func BenchmarkCheckpoint(b *testing.B) {
	a, _, _ := loaded(b, benchKeys)
	dir := b.TempDir()
	b.Run("write", func(b *testing.B) {
		var bytes int64
		start := cpuNanos()
		defer func() { b.ReportMetric(float64(cpuNanos()-start)/float64(b.N)/1e9, "cpu-s/op") }()
		for range b.N {
			n, sz, err := a.r.Checkpoint(dir, time.Now())
			if err != nil || n != benchKeys {
				b.Fatal(n, err)
			}
			bytes = sz
		}
		b.ReportMetric(float64(bytes), "bytes")
	})
	b.Run("restore", func(b *testing.B) {
		start := cpuNanos()
		defer func() { b.ReportMetric(float64(cpuNanos()-start)/float64(b.N)/1e9, "cpu-s/op") }()
		for range b.N {
			c := newNode("a", nil, nil, 9e14, true)
			if n, err := c.r.Restore(dir, c.now, time.Now()); err != nil || n != benchKeys {
				b.Fatal(n, err)
			}
		}
	})
}

// BenchmarkDecide is the decision path (shard Acquire) alone, and with
// the replication hooks (Install, Touch) of a rule that is not durable
// and of a durable one, while the node keeps 100k copies for others.
func BenchmarkDecide(b *testing.B) {
	tbl := table(
		&rule.Rule{Name: "plain", Algorithm: bucket.TokenBucket, Limit: 1 << 40, Period: time.Hour},
		&rule.Rule{Name: "durable", Algorithm: bucket.TokenBucket, Limit: 1 << 40, Period: time.Hour, Durable: true},
	)
	view := cluster.NewView(1, []cluster.Member{{ID: "a"}, {ID: "b"}})
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprint("user-", i)
	}
	for _, tc := range []struct {
		name  string
		rule  string
		hooks bool
	}{{"bare", "plain", false}, {"plain", "plain", true}, {"durable", "durable", true}} {
		b.Run(tc.name, func(b *testing.B) {
			n := newNode("a", tbl, view, 1e15, true)
			for i := range 100_000 {
				n.r.Store.Put(Copy{State: shardState("durable", fmt.Sprint("other-", i)), At: n.now})
			}
			c := tbl.Get(tc.rule)
			b.ReportAllocs()
			b.ResetTimer()
			start := cpuNanos()
			defer func() { b.ReportMetric(float64(cpuNanos()-start)/float64(b.N), "cpu-ns/op") }()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					k := keys[i%len(keys)]
					if tc.hooks {
						if err := n.r.Install(c, k); err != nil {
							b.Error(err)
						}
					}
					d, err := n.m.Acquire(c, k, bucket.Request{Permits: 1}, n.now)
					if err != nil {
						b.Error(err)
						return
					}
					if tc.hooks {
						n.r.Touch(c, k, d.Granted)
					}
				}
			})
		})
	}
}

func shardState(ruleName, key string) shard.BucketState {
	return shard.BucketState{Rule: ruleName, Key: key, Generation: 2}
}
