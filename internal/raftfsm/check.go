package raftfsm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
)

// ErrDamaged marks a data directory whose Raft log or stable store cannot
// be read back whole.
var ErrDamaged = errors.New("raft data is damaged")

// DamagedHelp is what an operator can do about a damaged data directory;
// errors wrapping ErrDamaged end with it.
const DamagedHelp = "the node will not start from it. Either (1) move the data dir aside and rejoin the cluster " +
	"(--join: the rules come back from the other members), (2) on the last survivor of a cluster, start from a fresh " +
	"data dir and `tokenctl snapshot restore` a saved snapshot, or (3) if other members hold the log, recover quorum " +
	"from one of them with `tokenserver recover`; see docs/operations.md, \"Damaged data\""

// boltFile is the name of the Raft log and stable store under the data dir.
const boltFile = "raft.db"

// openBolt opens the log and stable store, waiting at most 5 s for the
// file lock another process may hold.
func openBolt(dir string, readOnly bool) (*raftboltdb.BoltStore, error) {
	path := filepath.Join(dir, boltFile)
	s, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{Timeout: 5 * time.Second, ReadOnly: readOnly}})
	switch {
	case errors.Is(err, bbolt.ErrTimeout):
		return nil, fmt.Errorf("open %s: another process holds it (is a tokenserver already running on this data dir?)", path)
	case err != nil:
		return nil, fmt.Errorf("open %s: %w: %w; %s", path, err, ErrDamaged, DamagedHelp)
	}
	return s, nil
}

// CheckDataDir reads back every entry of the Raft log and the stable store
// under dir and decodes every entry this node applies. It returns nil for
// a directory without a log, and an error wrapping ErrDamaged, naming the
// file and what to do, when a page is damaged, the file is truncated or an
// entry does not decode. It runs before raft opens the store: bbolt and
// raft panic on such data, and a partly readable log would otherwise start
// a node that is silently missing rules.
func CheckDataDir(dir string) error {
	path := filepath.Join(dir, boltFile)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		// A truncated file faults when bbolt reads past its end through
		// the memory map: turn the fault into a panic we can recover, in
		// this goroutine only.
		debug.SetPanicOnFault(true)
		defer func() {
			if p := recover(); p != nil {
				errc <- fmt.Errorf("%s: %v: %w; %s", path, p, ErrDamaged, DamagedHelp)
			}
		}()
		errc <- checkBolt(dir, path)
	}()
	return <-errc
}

func checkBolt(dir, path string) error {
	s, err := openBolt(dir, true)
	if err != nil {
		return err
	}
	defer s.Close()
	damaged := func(format string, args ...any) error {
		return fmt.Errorf("%s: %s: %w; %s", path, fmt.Sprintf(format, args...), ErrDamaged, DamagedHelp)
	}
	for _, k := range []string{"CurrentTerm", "LastVoteTerm"} {
		if _, err := s.GetUint64([]byte(k)); err != nil && err.Error() != "not found" {
			return damaged("stable store key %s: %v", k, err)
		}
	}
	first, err := s.FirstIndex()
	if err != nil {
		return damaged("first index: %v", err)
	}
	last, err := s.LastIndex()
	if err != nil {
		return damaged("last index: %v", err)
	}
	if first == 0 && last == 0 {
		return nil
	}
	if first == 0 || last < first {
		return damaged("log bounds %d..%d", first, last)
	}
	var l raft.Log
	for i := first; i <= last; i++ {
		if err := s.GetLog(i, &l); err != nil {
			return damaged("log entry %d of %d..%d: %v", i, first, last, err)
		}
		if l.Index != i {
			return damaged("log entry %d holds index %d", i, l.Index)
		}
		switch l.Type {
		case raft.LogCommand:
			if _, _, err := decodeEntry(l.Data); errors.Is(err, errUnknownEntry) {
				return fmt.Errorf("%s: log entry %d: %w", path, i, err)
			} else if err != nil {
				return damaged("log entry %d: %v", i, err)
			}
		case raft.LogConfiguration:
			raft.DecodeConfiguration(l.Data) // panics on damage: recovered above
		}
	}
	return nil
}
