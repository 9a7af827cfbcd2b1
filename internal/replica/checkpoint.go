package replica

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protodelim"

	"github.com/tokenserver/tokenserver/internal/handoff"
	"github.com/tokenserver/tokenserver/internal/shard"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
)

// CheckpointFile is the checkpoint's name in the data dir.
const CheckpointFile = "durable-buckets.ckpt"

// checkpointVersion is CheckpointHeader.version.
const checkpointVersion = 1

// maxCheckpointMessage bounds one message read back from a checkpoint.
const maxCheckpointMessage = 64 << 20

// Changed reports whether buckets were sent or copies received since the
// last checkpoint (so a checkpoint would differ from the last one).
func (r *Replicator) Changed() bool { return r.changed.Load() }

// Checkpoint writes every durable bucket of this node, and every copy it
// keeps for others, to dir/CheckpointFile atomically: a temporary file,
// one fsync, a rename. A crash leaves the previous checkpoint or this
// one, never a mix. wall is the wall clock now. It returns the buckets
// and bytes written.
func (r *Replicator) Checkpoint(dir string, wall time.Time) (buckets, bytes int64, err error) {
	r.changed.Store(false)
	start := time.Now()
	tmp, err := os.CreateTemp(dir, CheckpointFile+".tmp-*")
	if err != nil {
		return 0, 0, fmt.Errorf("checkpoint: %w", err)
	}
	defer func() {
		if err != nil {
			r.changed.Store(true)
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w := &countWriter{w: bufio.NewWriterSize(tmp, 1<<20)}
	now := r.l.Now()
	if _, err = protodelim.MarshalTo(w, &peerv1.CheckpointHeader{Version: checkpointVersion, NodeId: r.l.ID, WallUnixNs: wall.UnixNano(), NowNs: now}); err != nil {
		return 0, 0, fmt.Errorf("checkpoint header: %w", err)
	}
	issuers, err := issuersPB(r.l.Buckets.Issuers())
	if err != nil {
		return 0, 0, err
	}
	// Batches of one clock: this node's own buckets as of now, then the
	// copies grouped by the time they were taken.
	batches := map[int64]*peerv1.ReplicaBatch{}
	var order []int64
	flush := func(at int64) error {
		b := batches[at]
		if b == nil || len(b.Buckets) == 0 {
			return nil
		}
		if _, err := protodelim.MarshalTo(w, b); err != nil {
			return fmt.Errorf("checkpoint batch: %w", err)
		}
		buckets += int64(len(b.Buckets))
		b.Buckets, b.Issuers = b.Buckets[:0], nil
		return nil
	}
	add := func(at int64, s shard.BucketState) error {
		b := batches[at]
		if b == nil {
			b = &peerv1.ReplicaBatch{From: r.l.ID, SenderNowNs: at}
			batches[at] = b
			order = append(order, at)
		}
		b.Buckets = append(b.Buckets, handoff.ToPB(s))
		if len(b.Buckets) >= BatchBuckets {
			return flush(at)
		}
		return nil
	}
	batches[now] = &peerv1.ReplicaBatch{From: r.l.ID, SenderNowNs: now, Issuers: issuers}
	order = append(order, now)
	t := r.l.Table()
	err = r.l.Buckets.Export(now, func(ruleName, _ string) bool {
		c := t.Get(ruleName)
		return c != nil && c.Rule.Durable
	}, func(s shard.BucketState) error { return add(now, s) })
	if err != nil {
		return 0, 0, fmt.Errorf("checkpoint: %w", err)
	}
	var copies []Copy
	r.Store.Range(func(c Copy) bool { copies = append(copies, c); return true })
	for _, c := range copies {
		if err = add(c.At, c.State); err != nil {
			return 0, 0, err
		}
	}
	for _, at := range order {
		if err = flush(at); err != nil {
			return 0, 0, err
		}
	}
	if err = w.w.(*bufio.Writer).Flush(); err != nil {
		return 0, 0, fmt.Errorf("checkpoint: %w", err)
	}
	if err = tmp.Sync(); err != nil {
		return 0, 0, fmt.Errorf("checkpoint fsync: %w", err)
	}
	if err = tmp.Close(); err != nil {
		return 0, 0, fmt.Errorf("checkpoint: %w", err)
	}
	if err = os.Rename(tmp.Name(), filepath.Join(dir, CheckpointFile)); err != nil {
		return 0, 0, fmt.Errorf("checkpoint rename: %w", err)
	}
	r.CheckpointBuckets.Store(buckets)
	r.CheckpointBytes.Store(w.n)
	r.CheckpointNanos.Store(int64(time.Since(start)))
	return buckets, w.n, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// RestoreOnce is Restore the first time it is called and a no-op after
// (did is false then). Concurrent callers wait for the first.
func (r *Replicator) RestoreOnce(dir string, now int64, wall time.Time) (kept int64, did bool, err error) {
	r.restoreMu.Lock()
	defer r.restoreMu.Unlock()
	if r.restored.Load() {
		return 0, false, nil
	}
	defer r.restored.Store(true)
	kept, err = r.Restore(dir, now, wall)
	return kept, true, err
}

// Restored reports whether RestoreOnce has run: until then a checkpoint
// would overwrite the one not yet read back.
func (r *Replicator) Restored() bool { return r.restored.Load() }

// Restore reads dir/CheckpointFile back into the Store as copies, as of
// this node's clock now and the wall clock wall. It needs no rule table,
// so it runs before the node decides anything: like any replica, a copy
// is only installed when this node decides for its key, as its owner or
// in its owner's stead, and then only when its rule is still durable, of
// the same generation, and the copy is younger than the rule's window
// (Install; Prune drops the others). No file, or no dir, is not an
// error. It returns
// the copies kept.
func (r *Replicator) Restore(dir string, now int64, wall time.Time) (int64, error) {
	if dir == "" {
		return 0, nil // checkpoints are off
	}
	f, err := os.Open(filepath.Join(dir, CheckpointFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("restore checkpoint: %w", err)
	}
	defer f.Close()
	rd := bufio.NewReaderSize(f, 1<<20)
	opts := protodelim.UnmarshalOptions{MaxSize: maxCheckpointMessage}
	var hdr peerv1.CheckpointHeader
	if err := opts.UnmarshalFrom(rd, &hdr); err != nil {
		return 0, fmt.Errorf("restore checkpoint header: %w", err)
	}
	if hdr.GetVersion() != checkpointVersion {
		return 0, fmt.Errorf("restore checkpoint: unknown version %d", hdr.GetVersion())
	}
	age := max(0, wall.UnixNano()-hdr.GetWallUnixNs())
	base := now - age // the header's now_ns on this node's clock
	var kept int64
	for {
		var b peerv1.ReplicaBatch
		if err := opts.UnmarshalFrom(rd, &b); errors.Is(err, io.EOF) {
			return kept, nil
		} else if err != nil {
			return kept, fmt.Errorf("restore checkpoint: %w", err)
		}
		at := base + (b.GetSenderNowNs() - hdr.GetNowNs())
		n, err := r.storeBatch(&b, at)
		if err != nil {
			return kept, fmt.Errorf("restore checkpoint: %w", err)
		}
		kept += n
	}
}
