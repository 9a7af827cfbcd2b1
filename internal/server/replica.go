package server

import (
	"cmp"
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/overadmit"
	"github.com/tokenserver/tokenserver/internal/replica"
	"github.com/tokenserver/tokenserver/internal/rule"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
)

// Durable rules (internal/replica): every decision on a durable rule marks
// its bucket dirty; every ReplicationInterval the dirty buckets go to
// their keys' next owners, which keep them as copies and install a copy
// before they decide for its key. Every CheckpointInterval (when anything
// changed) the node's durable buckets and copies are written to the data
// dir, and read back once the node is ready after a start.

// newReplica builds the node's replicator and registers its peer-only
// service and metrics.
func (n *Node) newReplica() func(grpc.ServiceRegistrar) {
	n.replica = replica.New(replica.Local{
		ID: n.data.ID(), Buckets: n.buckets, Table: n.data.Table, Now: func() int64 { return n.now() }, View: n.data.View,
		IsPeer: func(ctx context.Context) bool { return !n.peersOnly || auth.IsPeer(ctx) },
	})
	r := n.replica
	// What this node admitted on durable buckets since their last
	// acknowledged copy is part of tokenserver_overadmission_bound_permits;
	// so are the keys whose copy this node dropped for want of room
	// (a copy infinitely behind): they start fresh here after a crash of
	// their owner, each with its capacity.
	n.bound.Add(overadmit.Func{N: "replication_lag", F: func(c *rule.Compiled, _ time.Time) int64 {
		return r.Tracker.LagPermits(c.Rule.Name) + r.Store.DroppedPermits(c, n.now())
	}})
	n.metrics.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_replication_sent_buckets_total", Help: "Durable buckets this node sent to the next owners of their keys."},
			func() float64 { return float64(r.SentBuckets.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_replication_sent_bytes_total", Help: "Bytes of durable bucket state this node sent to next owners."},
			func() float64 { return float64(r.SentBytes.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_replication_failures_total", Help: "Replication streams to a next owner that failed (their buckets are sent again)."},
			func() float64 { return float64(r.Failures.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_replication_installed_total", Help: "Copies of durable buckets this node installed before deciding for their keys."},
			func() float64 { return float64(r.Installed.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokenserver_replication_copies", Help: "Copies of other nodes' durable buckets (and of checkpointed ones) this node keeps."},
			func() float64 { return float64(r.Store.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokenserver_replication_copies_bytes", Help: "Estimated memory of the copies this node keeps, counted in tokenserver_bucket_memory_bytes against --max-bucket-memory."},
			func() float64 { return float64(r.Store.Bytes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokenserver_replication_copies_limit_bytes", Help: "The most memory copies may take: a share of --max-bucket-memory."},
			func() float64 { return float64(r.Store.MaxBytes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokenserver_replication_copies_dropped", Help: "Keys whose copy this node dropped for want of room, within their window: they start fresh after a crash of their owner (counted in tokenserver_overadmission_bound_permits)."},
			func() float64 { return float64(r.Store.Dropped()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokenserver_checkpoint_buckets", Help: "Durable buckets and copies in the last checkpoint written to the data dir."},
			func() float64 { return float64(r.CheckpointBuckets.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokenserver_checkpoint_bytes", Help: "Size of the last checkpoint written to the data dir."},
			func() float64 { return float64(r.CheckpointBytes.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokenserver_checkpoint_duration_seconds", Help: "How long the last checkpoint took to write, fsync included."},
			func() float64 { return time.Duration(r.CheckpointNanos.Load()).Seconds() }),
		&lagCollector{n: n},
	)
	return func(s grpc.ServiceRegistrar) { peerv1.RegisterReplicaServiceServer(s, r) }
}

// LagSource is the replication-lag component of
// tokenserver_overadmission_bound_permits: per rule, the permits this node
// admitted in durable buckets since their last acknowledged replication
// (what a kill -9 of this node could admit twice). *replica.Tracker
// implements it; Node.ReplicationLag returns it.
type LagSource interface {
	LagPermits(ruleName string) int64
}

// ReplicationLag returns the node's replication lag per rule.
func (n *Node) ReplicationLag() LagSource { return n.replica.Tracker }

// lagDesc is tokenserver_replication_lag_permits.
var lagDesc = prometheus.NewDesc("tokenserver_replication_lag_permits",
	"Per durable rule, the permits this node admitted since their buckets were last replicated to the next owners: what a crash of this node could admit again (a part of tokenserver_overadmission_bound_permits).",
	[]string{"rule"}, nil)

// lagCollector reports lagDesc for the durable rules on every scrape.
type lagCollector struct{ n *Node }

func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) { ch <- lagDesc }

func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.n.data.Table().Rules() {
		if r.Durable {
			ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(c.n.replica.Tracker.LagPermits(r.Name)), r.Name)
		}
	}
}

// installReplica installs the copy this node keeps of key's bucket of c,
// if any, before it decides for the key.
func (n *Node) installReplica(c *rule.Compiled, key string) {
	if c == nil || !c.Rule.Durable {
		return
	}
	if !n.replica.Restored() {
		n.restoreCheckpoint() // the first durable decision after a start waits for it
	}
	if err := n.replica.Install(c, key); err != nil {
		n.log.Warn("replica: copy not installed; the key continues from this node's own bucket", "rule", c.Rule.Name, "err", err)
	}
}

// pruneEvery is how many replication ticks pass between two prunes of
// useless copies (Replicator.Prune).
const pruneEvery = 60

// replicate sends dirty durable buckets every ReplicationInterval and
// checkpoints every CheckpointInterval, until the node stops; then it
// writes a last checkpoint. It first reads the checkpoint back (a
// decision on a durable rule that comes earlier waits for that).
func (n *Node) replicate() {
	defer n.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-n.done; cancel() }()
	interval := cmp.Or(n.cfg.ReplicationInterval, DefaultReplicationInterval)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	dir, every := n.cfg.CheckpointDir, cmp.Or(n.cfg.CheckpointInterval, DefaultCheckpointInterval)
	ck := time.NewTicker(every)
	defer ck.Stop()
	n.restoreCheckpoint()
	ticks := 0
	view, viewCh := n.data.View(), n.data.ViewChanged()
	for {
		select {
		case <-viewCh:
			cur := n.data.View()
			if _, err := n.replica.Resync(view, cur); err != nil {
				n.log.Warn("replica: durable buckets not sent to their new next owners until they change", "err", err)
			}
			view, viewCh = cur, n.data.ViewChanged()
		case <-n.done:
			if dir != "" {
				n.checkpoint(dir)
			}
			return
		case <-tick.C:
			if ticks++; ticks%pruneEvery == 0 && n.data.Ready() {
				n.replica.Prune()
			}
			tctx, tcancel := context.WithTimeout(ctx, max(interval, time.Second))
			if err := n.replica.Tick(tctx, n.dialPeer); err != nil && ctx.Err() == nil {
				n.log.Warn("replica: durable buckets not replicated; sent again next time", "err", err)
			}
			tcancel()
		case <-ck.C:
			if dir != "" && n.replica.Changed() {
				n.checkpoint(dir)
			}
		}
	}
}

// restoreCheckpoint reads the checkpoint back, once.
func (n *Node) restoreCheckpoint() {
	start := time.Now()
	kept, did, err := n.replica.RestoreOnce(n.cfg.CheckpointDir, n.now(), time.Now())
	switch {
	case err != nil:
		n.log.Warn("replica: checkpoint not restored; durable keys continue from replicas or start fresh", "err", err)
	case did && kept > 0:
		n.log.Info("replica: checkpoint restored", "buckets", kept, "took", time.Since(start))
	}
}

// checkpoint writes the checkpoint and logs a failure.
func (n *Node) checkpoint(dir string) {
	if _, _, err := n.replica.Checkpoint(dir, time.Now()); err != nil {
		n.log.Warn("replica: checkpoint not written; the previous one stays", "err", err)
	}
}
