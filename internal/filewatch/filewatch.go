// Package filewatch re-reads a set of files, or the files of directories,
// when their content changes, and hands the new content to a loader.
//
// It polls and compares a SHA-256 digest of the content instead of using
// inotify (fsnotify is not among the module's dependencies, and events are
// easy to miss across a rename): polling sees a file rewritten in place
// and a Kubernetes volume's ..data symlink swap alike, and costs one read
// of each file per interval.
package filewatch

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultInterval is Options.Interval when it is 0.
const DefaultInterval = 5 * time.Second

// File is one file read.
type File struct {
	// Path is the file's name: an Options.Paths entry, or for a directory
	// the directory joined with the file's name. "" for an empty entry.
	Path string
	// Data is the file's content (nil for an empty entry).
	Data []byte
}

// Content is one reading of the watched files.
type Content struct {
	// Files are in the order of Options.Paths; a directory stands for its
	// regular files (symlinks followed, names starting with "." skipped,
	// as Kubernetes' ..data), sorted by name.
	Files []File
	// Digest is a SHA-256 over the paths and contents.
	Digest [32]byte
	// Generation is the Watcher's Generation once Load accepts this
	// content: 1 for New's load.
	Generation uint64
}

// Options configures a Watcher.
type Options struct {
	// Paths are the files and directories to watch. An empty entry stands
	// for no file and yields a File with no Path, so that indexes into
	// Content.Files stay fixed.
	Paths []string
	// Interval is how often the files are read (DefaultInterval when 0;
	// below 0 never: only Check reads them).
	Interval time.Duration
	// Load installs new content. It is called once by New, then whenever
	// the content differs from what it last accepted, never concurrently.
	// On an error the previous content stays in use, and the same content
	// is not offered again.
	Load func(Content) error
	// OnError receives the errors of polls (a file that cannot be read, or
	// Load's error); nil drops them. The same error on consecutive polls
	// (a file that stays deleted) is reported once; Status keeps saying it.
	OnError func(error)
	// Now is the clock of Status's times (time.Now when nil).
	Now func() time.Time
}

// Status is the outcome of a Watcher's checks, for metrics.
type Status struct {
	// OK reports whether the last check read the files and the content in
	// use is theirs: false after a read error (a deleted file) or a
	// content that Load refused, until a later check succeeds.
	OK bool
	// LastSuccess is when a check last found the files readable and their
	// content loaded (loaded then, or unchanged since).
	LastSuccess time.Time
	// Err is the last check's error (nil when OK).
	Err error
}

// ReadError is a watched file or directory that could not be read.
type ReadError struct {
	Path string
	Err  error
}

func (e *ReadError) Error() string { return fmt.Sprintf("read %s: %v", e.Path, e.Err) }

// Unwrap returns Err.
func (e *ReadError) Unwrap() error { return e.Err }

// Watcher polls files and loads their content when it changes. It is safe
// for simultaneous use.
type Watcher struct {
	o   Options
	gen atomic.Uint64

	mu                 sync.Mutex // serializes Check; guards the fields below
	loaded, lastFailed [32]byte
	hasLoaded          bool
	hasFailed          bool // lastFailed holds a refused content's digest
	partial            bool // the loaded content was installed in part (PartialError)
	status             Status

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// New reads the files and loads them; an error of either is returned and
// nothing polls. Then, unless o.Interval < 0, it polls them until Close.
func New(o Options) (*Watcher, error) {
	if o.Load == nil {
		return nil, fmt.Errorf("filewatch: no Load")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	w := &Watcher{o: o, stop: make(chan struct{})}
	if err := w.Check(); err != nil {
		return nil, err
	}
	interval := o.Interval
	if interval == 0 {
		interval = DefaultInterval
	}
	if interval > 0 {
		w.wg.Add(1)
		go w.poll(interval)
	}
	return w, nil
}

// Check reads the files now and loads them when their content changed. It
// returns a *ReadError, or Load's error the first time Load refuses a
// content; nil when nothing changed.
// A content Load refused is not offered again; while the files keep it,
// Status stays not OK.
func (w *Watcher) Check() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	refusedAgain, err := w.check()
	switch {
	case err != nil:
		w.status.OK, w.status.Err = false, err
	case !refusedAgain:
		w.status = Status{OK: true, LastSuccess: w.o.Now()}
	}
	return err
}

func (w *Watcher) check() (refusedAgain bool, err error) {
	c, err := w.read()
	if err != nil {
		return false, err
	}
	if w.hasLoaded && c.Digest == w.loaded {
		return w.partial, nil
	}
	if w.hasFailed && c.Digest == w.lastFailed {
		return true, nil // still the refused content, reported once
	}
	c.Generation = w.gen.Load() + 1
	err = w.o.Load(c)
	var pe *PartialError
	if err != nil && !errors.As(err, &pe) {
		w.lastFailed, w.hasFailed = c.Digest, true
		return false, err
	}
	w.loaded, w.hasLoaded, w.partial = c.Digest, true, err != nil
	w.hasFailed = false
	w.gen.Add(1)
	return false, err
}

// PartialError is what Load returns when it installed a content in part
// (a token file without its bad lines): the content counts as loaded (its
// generation is taken, and a return to the content before it loads that
// again), while Check returns the error once and Status stays not OK until
// the files change.
type PartialError struct {
	Err error
}

func (e *PartialError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *PartialError) Unwrap() error { return e.Err }

// Status returns the outcome of the last check.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status
}

// Generation counts the contents Load accepted: 1 after New.
func (w *Watcher) Generation() uint64 { return w.gen.Load() }

// Close stops polling and waits for a poll under way.
func (w *Watcher) Close() {
	w.stopOnce.Do(func() { close(w.stop) })
	w.wg.Wait()
}

func (w *Watcher) poll(interval time.Duration) {
	defer w.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	last := "" // the error last reported: a file that stays deleted is reported once
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			err := w.Check()
			switch {
			case err == nil:
				last = ""
			case err.Error() != last:
				last = err.Error()
				if w.o.OnError != nil {
					w.o.OnError(err)
				}
			}
		}
	}
}

// read reads every file and digests them.
func (w *Watcher) read() (Content, error) {
	var c Content
	for _, p := range w.o.Paths {
		if p == "" {
			c.Files = append(c.Files, File{})
			continue
		}
		info, err := os.Stat(p)
		if err != nil {
			return Content{}, &ReadError{Path: p, Err: err}
		}
		if !info.IsDir() {
			data, err := os.ReadFile(p)
			if err != nil {
				return Content{}, &ReadError{Path: p, Err: err}
			}
			c.Files = append(c.Files, File{Path: p, Data: data})
			continue
		}
		files, err := readDir(p)
		if err != nil {
			return Content{}, err
		}
		c.Files = append(c.Files, files...)
	}
	h := sha256.New()
	var n [8]byte
	for _, f := range c.Files {
		for _, b := range [][]byte{[]byte(f.Path), f.Data} {
			binary.BigEndian.PutUint64(n[:], uint64(len(b)))
			h.Write(n[:])
			h.Write(b)
		}
	}
	h.Sum(c.Digest[:0])
	return c, nil
}

// readDir reads the regular files of dir (symlinks followed), by name,
// skipping names that start with ".".
func readDir(dir string) ([]File, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, &ReadError{Path: dir, Err: err}
	}
	var out []File
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		info, err := os.Stat(p)
		if err != nil {
			return nil, &ReadError{Path: p, Err: err}
		}
		if !info.Mode().IsRegular() {
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, &ReadError{Path: p, Err: err}
		}
		out = append(out, File{Path: p, Data: data})
	}
	return out, nil
}
