package envoyrls

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ConfigFileNames lists the files of dir that LoadDir reads, sorted: every
// *.yaml and *.yml directly in dir, skipping names that start with '.'
// (Kubernetes' "..data" and "..2024_…" entries of a ConfigMap volume, and
// editor files such as .swp or Emacs' .#name.yaml locks) and directories.
// Entries are read through symlinks, so a ConfigMap's name → ..data/name
// links lead to the files of the current version. Names ending in '~' or
// .swp are skipped by their extension.
func ConfigFileNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read envoy config dir: %w", err)
	}
	var names []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		ext := filepath.Ext(name)
		if ext != ".yaml" && ext != ".yml" {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, name)) // follows symlinks
		if err != nil {
			if os.IsNotExist(err) {
				continue // a dangling link mid-swap: the next load sees the new one
			}
			return nil, fmt.Errorf("read envoy config dir: %w", err)
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return names, nil
}

// LoadDir parses every file ConfigFileNames lists into one Config. Any bad
// file refuses the whole directory, with every problem named (file, line
// where known, problem). Each domain's Meta carries Source NAME and Author
// "file:NAME"; the version is the caller's to set.
func LoadDir(dir string) (*Config, error) {
	names, err := ConfigFileNames(dir)
	if err != nil {
		return nil, err
	}
	files := make([]File, 0, len(names))
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, fmt.Errorf("read envoy config file: %w", err)
		}
		files = append(files, File{Name: n, Data: b, Meta: Meta{Author: "file:" + n, Source: n}})
	}
	c, err := ParseFiles(files)
	if err != nil {
		return nil, fmt.Errorf("envoy config dir %s: %w", dir, err)
	}
	return c, nil
}
