package filewatch

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// replace writes a file by renaming a complete one over it, so that a
// poll never reads it half written.
func replace(t *testing.T, name, data string) {
	t.Helper()
	tmp := name + ".tmp"
	write(t, tmp, data)
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
}

// recorder is a Load that keeps what it was given and refuses content
// that starts with "bad".
type recorder struct {
	loads []Content
	seen  chan Content // when not nil, every load is sent here too
}

func (r *recorder) load(c Content) error {
	for _, f := range c.Files {
		if strings.HasPrefix(string(f.Data), "bad") {
			return errors.New("bad content in " + f.Path)
		}
	}
	r.loads = append(r.loads, c)
	if r.seen != nil {
		r.seen <- c
	}
	return nil
}

// files renders a Content as "path=data;..." with paths relative to dir.
func files(dir string, c Content) string {
	var parts []string
	for _, f := range c.Files {
		rel := f.Path
		if rel != "" {
			rel, _ = filepath.Rel(dir, f.Path)
		}
		parts = append(parts, rel+"="+string(f.Data))
	}
	return strings.Join(parts, ";")
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	write(t, a, "1")
	write(t, b, "x")
	var r recorder
	w, err := New(Options{Paths: []string{a, "", b}, Interval: -1, Load: r.load})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	steps := []struct {
		name    string
		change  func()
		wantErr bool
		loads   int    // Load calls that succeeded so far
		last    string // the content of the last successful load
		gen     uint64
	}{
		{"initial", func() {}, false, 1, "a=1;=;b=x", 1},
		{"unchanged", func() {}, false, 1, "a=1;=;b=x", 1},
		{"rewritten, same bytes", func() { write(t, a, "1") }, false, 1, "a=1;=;b=x", 1},
		{"changed", func() { write(t, a, "2") }, false, 2, "a=2;=;b=x", 2},
		{"refused", func() { write(t, b, "bad") }, true, 2, "a=2;=;b=x", 2},
		{"refused again: not offered twice", func() {}, false, 2, "a=2;=;b=x", 2},
		{"fixed", func() { write(t, b, "y") }, false, 3, "a=2;=;b=y", 3},
		{"back to content seen before", func() { write(t, a, "1") }, false, 4, "a=1;=;b=y", 4},
	}
	for _, s := range steps {
		s.change()
		err := w.Check()
		if (err != nil) != s.wantErr {
			t.Fatalf("%s: Check = %v, want error %v", s.name, err, s.wantErr)
		}
		if len(r.loads) != s.loads || files(dir, r.loads[len(r.loads)-1]) != s.last || w.Generation() != s.gen {
			t.Fatalf("%s: %d loads, last %q, generation %d; want %d, %q, %d", s.name,
				len(r.loads), files(dir, r.loads[len(r.loads)-1]), w.Generation(), s.loads, s.last, s.gen)
		}
	}
}

func TestReadErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	var r recorder
	_, err := New(Options{Paths: []string{missing}, Interval: -1, Load: r.load})
	var re *ReadError
	if !errors.As(err, &re) || re.Path != missing || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("New on a missing file: %v, want a ReadError naming it", err)
	}
	if _, err := New(Options{Paths: []string{missing}, Interval: -1}); err == nil {
		t.Error("New without Load: nil error")
	}

	a := filepath.Join(dir, "a")
	write(t, a, "1")
	w, err := New(Options{Paths: []string{a}, Interval: -1, Load: r.load})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	if err := w.Check(); !errors.As(err, &re) {
		t.Errorf("Check on a removed file: %v, want a ReadError", err)
	}
	write(t, a, "1")
	if err := w.Check(); err != nil || len(r.loads) != 1 {
		t.Errorf("the file back as it was: %v, %d loads; want no new load", err, len(r.loads))
	}
}

// TestDirectory: a directory stands for its regular files by name; hidden
// names and subdirectories are skipped; adding or removing a file is a
// change.
func TestDirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "b.yaml"), "b")
	write(t, filepath.Join(dir, "a.yaml"), "a")
	write(t, filepath.Join(dir, ".hidden"), "h")
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "sub", "c.yaml"), "c")
	var r recorder
	w, err := New(Options{Paths: []string{dir}, Interval: -1, Load: r.load})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, s := range []struct {
		name   string
		change func()
		want   string
	}{
		{"initial", func() {}, "a.yaml=a;b.yaml=b"},
		{"added", func() { write(t, filepath.Join(dir, "c.yaml"), "c") }, "a.yaml=a;b.yaml=b;c.yaml=c"},
		{"removed", func() { os.Remove(filepath.Join(dir, "a.yaml")) }, "b.yaml=b;c.yaml=c"},
		{"renamed", func() { os.Rename(filepath.Join(dir, "c.yaml"), filepath.Join(dir, "d.yaml")) }, "b.yaml=b;d.yaml=c"},
		{"hidden file changed: no load", func() { write(t, filepath.Join(dir, ".hidden"), "h2") }, "b.yaml=b;d.yaml=c"},
	} {
		s.change()
		if err := w.Check(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := files(dir, r.loads[len(r.loads)-1]); got != s.want {
			t.Errorf("%s: loaded %q, want %q", s.name, got, s.want)
		}
	}
	if len(r.loads) != 4 {
		t.Errorf("%d loads, want 4", len(r.loads))
	}
}

// TestKubernetesSwap: a Kubernetes Secret or ConfigMap volume replaces its
// files by pointing the ..data symlink at a new directory; files and the
// directory are both seen to change.
func TestKubernetesSwap(t *testing.T) {
	dir := t.TempDir()
	install := func(version, content string) {
		t.Helper()
		ts := filepath.Join(dir, "..v"+version)
		if err := os.Mkdir(ts, 0o700); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(ts, "tls.crt"), content)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink("..v"+version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	install("1", "one")
	if err := os.Symlink(filepath.Join("..data", "tls.crt"), filepath.Join(dir, "tls.crt")); err != nil {
		t.Fatal(err)
	}
	var byFile, byDir recorder
	wf, err := New(Options{Paths: []string{filepath.Join(dir, "tls.crt")}, Interval: -1, Load: byFile.load})
	if err != nil {
		t.Fatal(err)
	}
	defer wf.Close()
	wd, err := New(Options{Paths: []string{dir}, Interval: -1, Load: byDir.load})
	if err != nil {
		t.Fatal(err)
	}
	defer wd.Close()
	install("2", "two")
	for _, w := range []*Watcher{wf, wd} {
		if err := w.Check(); err != nil {
			t.Fatal(err)
		}
	}
	if got := files(dir, byFile.loads[len(byFile.loads)-1]); got != "tls.crt=two" {
		t.Errorf("file watcher loaded %q, want tls.crt=two", got)
	}
	if got := files(dir, byDir.loads[len(byDir.loads)-1]); got != "tls.crt=two" {
		t.Errorf("directory watcher loaded %q, want tls.crt=two", got)
	}
}

// TestPoll: a started Watcher sees a change on its own, reports errors to
// OnError, and stops at Close.
func TestPoll(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	write(t, a, "1")
	r := recorder{seen: make(chan Content, 10)}
	errs := make(chan error, 100)
	w, err := New(Options{Paths: []string{a}, Interval: 5 * time.Millisecond, Load: r.load, OnError: func(err error) {
		select {
		case errs <- err:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	<-r.seen // New's load
	replace(t, a, "2")
	select {
	case c := <-r.seen:
		if string(c.Files[0].Data) != "2" {
			t.Errorf("polled content %q, want 2", c.Files[0].Data)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the change was not seen")
	}
	replace(t, a, "bad")
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "bad content") {
			t.Errorf("OnError got %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the refused content was not reported")
	}
	w.Close()
	write(t, a, "3")
	if err := w.Check(); err != nil { // Check still works after Close
		t.Fatal(err)
	}
	select {
	case <-r.seen: // the Check's own load
	default:
		t.Fatal("Check after Close did not load")
	}
	select {
	case c := <-r.seen:
		t.Errorf("a load after Close: %q", c.Files[0].Data)
	default:
	}
}

// TestGeneration: Load sees the generation its content becomes.
func TestGeneration(t *testing.T) {
	a := filepath.Join(t.TempDir(), "a")
	write(t, a, "1")
	var gens []uint64
	w, err := New(Options{Paths: []string{a}, Interval: -1, Load: func(c Content) error {
		gens = append(gens, c.Generation)
		if string(c.Files[0].Data) == "bad" {
			return errors.New("bad")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	write(t, a, "bad")
	_ = w.Check()
	write(t, a, "2")
	if err := w.Check(); err != nil {
		t.Fatal(err)
	}
	if want := []uint64{1, 2, 2}; !slices.Equal(gens, want) || w.Generation() != 2 {
		t.Errorf("Load saw generations %v (Generation %d), want %v", gens, w.Generation(), want)
	}
}

// TestDeletedFileReportedAndExported: a file deleted after a good load is
// reported (once, however many polls see it gone) and Status says so
// until the file is back; the last success time stays that of the last
// good check.
func TestDeletedFileReportedAndExported(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	write(t, a, "1")
	now := time.Unix(1000, 0)
	var r recorder
	w, err := New(Options{Paths: []string{a}, Interval: -1, Load: r.load, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if st := w.Status(); !st.OK || !st.LastSuccess.Equal(time.Unix(1000, 0)) || st.Err != nil {
		t.Fatalf("after New: %+v", st)
	}
	now = time.Unix(2000, 0)
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	var re *ReadError
	if err := w.Check(); !errors.As(err, &re) {
		t.Fatalf("Check of a deleted file = %v, want a *ReadError", err)
	}
	if st := w.Status(); st.OK || !st.LastSuccess.Equal(time.Unix(1000, 0)) || st.Err == nil {
		t.Fatalf("after the delete: %+v", st)
	}
	write(t, a, "bad")
	if err := w.Check(); err == nil {
		t.Fatal("refused content: no error")
	}
	if err := w.Check(); err != nil {
		t.Fatalf("refused content checked again: %v (reported once)", err)
	}
	if st := w.Status(); st.OK {
		t.Fatalf("refused content still on disk, yet OK: %+v", st)
	}
	now = time.Unix(3000, 0)
	write(t, a, "2")
	if err := w.Check(); err != nil {
		t.Fatal(err)
	}
	if st := w.Status(); !st.OK || !st.LastSuccess.Equal(time.Unix(3000, 0)) {
		t.Fatalf("after the fix: %+v", st)
	}
}

// TestPollReportsAnErrorOnce: a poll that keeps failing the same way calls
// OnError once.
func TestPollReportsAnErrorOnce(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	write(t, a, "1")
	errs := make(chan error, 100)
	var r recorder
	w, err := New(Options{Paths: []string{a}, Interval: time.Millisecond, Load: r.load, OnError: func(err error) { errs <- err }})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	<-errs
	// Many more polls (one a millisecond) see the same error.
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
		runtime.Gosched()
	}
	w.Close()
	if n := len(errs); n != 0 {
		t.Errorf("%d more reports of the same error", n)
	}
}

// TestPartialLoad: a content Load installed in part counts as loaded (a
// return to the previous content loads it again) and keeps Status not OK
// until the files change.
func TestPartialLoad(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	write(t, a, "1")
	var loads []string
	load := func(c Content) error {
		loads = append(loads, string(c.Files[0].Data))
		if strings.HasPrefix(string(c.Files[0].Data), "part") {
			return &PartialError{Err: errors.New("one bad line")}
		}
		return nil
	}
	w, err := New(Options{Paths: []string{a}, Interval: -1, Load: load})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	write(t, a, "part")
	var pe *PartialError
	if err := w.Check(); !errors.As(err, &pe) {
		t.Fatalf("Check = %v, want the PartialError", err)
	}
	if err := w.Check(); err != nil || w.Status().OK || w.Generation() != 2 {
		t.Fatalf("again: %v, status %+v, generation %d; want nil, not OK, 2", err, w.Status(), w.Generation())
	}
	write(t, a, "1")
	if err := w.Check(); err != nil || !w.Status().OK || w.Generation() != 3 {
		t.Fatalf("back to the first content: %v, status %+v, generation %d", err, w.Status(), w.Generation())
	}
	if want := []string{"1", "part", "1"}; !slices.Equal(loads, want) {
		t.Errorf("loads %q, want %q", loads, want)
	}
}
