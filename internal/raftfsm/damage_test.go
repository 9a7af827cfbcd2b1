package raftfsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// boltLeaves returns the leaf pages of the "logs" bucket of the bbolt file
// at path in key order (so in log index order), by reading bbolt's on-disk
// format: the newer meta page, the root bucket's leaf, then the bucket's
// tree. Tests damage those pages: damaging a page no tree references would
// prove nothing.
func boltLeaves(t *testing.T, path string) (pageSize int, leaves []uint64) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	// A page: id u64, flags u16, count u16, overflow u32, then elements.
	// meta (after the page header): magic u32, version u32, pageSize u32,
	// flags u32, root bucket {root u64, sequence u64}, freelist u64,
	// pgid u64, txid u64, checksum u64.
	meta := func(off int) (root, txid uint64, psz int) {
		m := data[off+16:]
		return le.Uint64(m[16:]), le.Uint64(m[48:]), int(le.Uint32(m[8:]))
	}
	r0, tx0, ps := meta(0)
	r1, tx1, _ := meta(ps)
	root := r0
	if tx1 > tx0 {
		root = r1
	}
	page := func(id uint64) []byte { return data[int(id)*ps : int(id)*ps+ps] }
	const branch, leaf = 0x01, 0x02
	// The root bucket's leaf holds the buckets by name: a leaf element is
	// flags u32, pos u32, ksize u32, vsize u32 (pos from the element).
	var logsRoot uint64
	var walkBuckets func(id uint64)
	walkBuckets = func(id uint64) {
		p := page(id)
		flags, count := le.Uint16(p[8:]), int(le.Uint16(p[10:]))
		for i := 0; i < count; i++ {
			e := 16 + i*16
			switch flags {
			case leaf:
				pos, ks := int(le.Uint32(p[e+4:])), int(le.Uint32(p[e+8:]))
				if string(p[e+pos:e+pos+ks]) == "logs" {
					logsRoot = le.Uint64(p[e+pos+ks:])
				}
			case branch: // branch element: pos u32, ksize u32, pgid u64
				walkBuckets(le.Uint64(p[e+8:]))
			}
		}
	}
	walkBuckets(root)
	if logsRoot == 0 {
		t.Fatal("the logs bucket is inline or missing: write more entries")
	}
	var walk func(id uint64)
	walk = func(id uint64) {
		p := page(id)
		flags, count := le.Uint16(p[8:]), int(le.Uint16(p[10:]))
		if flags == leaf {
			leaves = append(leaves, id)
			return
		}
		for i := 0; i < count; i++ {
			walk(le.Uint64(p[16+i*16+8:]))
		}
	}
	walk(logsRoot)
	return ps, leaves
}

// damagePage overwrites the element area of page id (its header stays, so
// bbolt still takes it for a leaf) with bytes that decode to nothing.
func damagePage(t *testing.T, path string, pageSize int, id uint64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	junk := make([]byte, pageSize-64)
	for i := range junk {
		junk[i] = byte(0xA5 ^ i)
	}
	if _, err := f.WriteAt(junk, int64(id)*int64(pageSize)+64); err != nil {
		t.Fatal(err)
	}
}

// copyDir copies a flat data dir and its snapshots.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(to, 0o750)
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, in)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDamagedDataFailsLoudly damages copies of a real data dir in each way
// and checks that the node refuses to start with an error that names the
// file and what to do: never a panic (raft and bbolt panic on such data)
// and never a start with a rule silently missing (an undecodable entry used
// to be skipped with an error result).
func TestDamagedDataFailsLoudly(t *testing.T) {
	c := newTestCluster(t)
	n := c.start("a", nil)
	waitFor(t, "ready", 20*time.Second, n.Ready)
	big := strings.Repeat("x", 200)
	for i := 0; i < 300; i++ {
		r := tbRule(fmt.Sprintf("rule-%03d-%s", i, big[:40]), int64(i+1))
		r.Deny = []string{big}
		if _, err := n.Put(ctxT(t), r, nil); err != nil {
			t.Fatal(err)
		}
	}
	c.stop("a")
	clean := c.dirs["a"]
	if err := CheckDataDir(clean); err != nil {
		t.Fatalf("the undamaged dir fails the check: %v", err)
	}
	ps, leaves := boltLeaves(t, filepath.Join(clean, boltFile))
	if len(leaves) < 5 {
		t.Fatalf("only %d leaf pages of log: the test wants a log of several pages", len(leaves))
	}
	for _, tc := range []struct {
		name   string
		damage func(path string)
	}{
		{"last page", func(path string) { damagePage(t, path, ps, leaves[len(leaves)-1]) }},
		{"middle page", func(path string) { damagePage(t, path, ps, leaves[len(leaves)/2]) }},
		{"truncated", func(path string) {
			info, _ := os.Stat(path)
			if err := os.Truncate(path, info.Size()/2); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated to a few bytes", func(path string) {
			if err := os.Truncate(path, 100); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, clean, dir)
			tc.damage(filepath.Join(dir, boltFile))
			cfg := c.config("a")
			cfg.DataDir, cfg.JoinVia = dir, c.reg.joinVia
			node, err := Open(cfg)
			if err == nil {
				node.Close()
				t.Fatal("a node started from a damaged log")
			}
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), filepath.Join(dir, boltFile)) ||
				!strings.Contains(err.Error(), "docs/operations.md") {
				t.Fatalf("the error does not say it is damage, name the file and what to do: %v", err)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
}

// TestUndecodableEntryStopsTheNode: a committed entry that does not decode
// stops the node, as an unknown entry type does, rather than being skipped.
func TestUndecodableEntryStopsTheNode(t *testing.T) {
	for _, data := range [][]byte{{entryPutRule, '{'}, {entryPutRule, 'n', 'u', 'l', 'l'}, {entrySetMember, '{', '}'}, {}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("entry %q was applied or skipped", data)
				}
			}()
			NewFSM().Apply(rawLog(1, data))
		}()
	}
}
