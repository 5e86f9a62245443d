package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/jobspec"
)

// datasetCache is the node's local datasets (Config.DatasetDir): each
// subdirectory of the directory is one dataset named after it, its size the
// bytes of the regular files under it (symbolic links are not followed).
// The agent reports the list at registration and, when a rescan finds it
// changed, with its next heartbeat (HeartbeatRequest.datasets_changed); the
// region keeps it in the node's record for that epoch, where the placement
// engine's data-locality score reads it (Dask's who_has, from the worker's
// own report).
type datasetCache struct {
	dir string

	mu      sync.Mutex
	list    []*apiaryv1.LocalDataset // sorted by name
	version int64                    // bumped at each change
}

// DefaultDatasetRescan is how often the dataset directory is rescanned.
const DefaultDatasetRescan = 10 * time.Second

// maxDatasets is the most datasets a node reports (the region's bound).
const maxDatasets = 10000

// capWarned: the maxDatasets cap was logged (once per process).
var capWarned atomic.Bool

func newDatasetCache(dir string) *datasetCache {
	d := &datasetCache{dir: dir}
	d.rescan()
	return d
}

// snapshot returns the current list and its version.
func (d *datasetCache) snapshot() ([]*apiaryv1.LocalDataset, int64) {
	if d == nil {
		return nil, 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.list, d.version
}

// path is where dataset name lives on this node, and whether the node holds
// it.
func (d *datasetCache) path(name string) (string, bool) {
	if d == nil || name == "" || strings.ContainsAny(name, "/\\") || name == "." || name == ".." {
		return "", false
	}
	// The disk, not the (capped) list: an output published past
	// maxDatasets is held too.
	p := filepath.Join(d.dir, name)
	if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
		return "", false
	}
	return p, true
}

// rescan reads the directory and bumps the version if the list changed. A
// directory that cannot be read holds no datasets (the error is not
// fatal: the agent runs tasks without them).
func (d *datasetCache) rescan() {
	list := scanDatasets(d.dir)
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.EqualFunc(list, d.list, func(a, b *apiaryv1.LocalDataset) bool {
		return a.GetName() == b.GetName() && a.GetSizeBytes() == b.GetSizeBytes()
	}) {
		d.list = list
		d.version++
	}
}

// scanDatasets lists dir's subdirectories with the bytes of their regular
// files, sorted by name.
func scanDatasets(dir string) []*apiaryv1.LocalDataset {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []*apiaryv1.LocalDataset
	for _, e := range entries {
		// The region's rules for a dataset name (jobspec.ValidDatasetName);
		// at most maxDatasets.
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || !jobspec.ValidDatasetName(e.Name()) {
			continue
		}
		if len(out) == maxDatasets {
			if !capWarned.Swap(true) {
				slog.Warn("dataset dir holds more datasets than the region takes; the rest are not reported", "dir", dir, "max", maxDatasets)
			}
			break
		}
		out = append(out, &apiaryv1.LocalDataset{Name: e.Name(), SizeBytes: dirBytes(filepath.Join(dir, e.Name()))})
	}
	return out
}

// outputsDirName is the directory inside an attempt's work dir where it
// writes its outputs (APIARY_OUTPUT_DIR).
const outputsDirName = "outputs"

// publish moves the outputs an attempt wrote into dir out (the entries
// named by names; others are left where they are) into the dataset
// directory and returns them with their sizes; then it rescans.
//
// Safety: out is in a directory the attempt's (task) user controls, so it
// is first renamed into staging, a directory only the agent writes (rename
// moves a symbolic link itself, never its target), and refused unless it
// is then a real directory: an attempt that replaced its output dir by a
// link to /etc cannot make the agent move /etc's files. Entries that are
// links are skipped the same way.
//
// Merging: outputs of one name from several attempts on the node (a group
// of count > 1 writing part files) are merged: a directory's entries are
// moved into the dataset's directory, replacing entries of the same name,
// and nothing else of the dataset is removed; a file becomes an entry of
// the dataset directory named after it. A move that fails (rename cannot
// cross file systems) leaves the existing dataset as it was and is
// returned in err.
func (d *datasetCache) publish(out, staging string, names []string) ([]*apiaryv1.LocalDataset, error) {
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return nil, err
	}
	_ = os.RemoveAll(staging)
	if err := os.Rename(out, staging); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil // the attempt removed its output dir: nothing to keep
		}
		return nil, fmt.Errorf("stage outputs: %w", err)
	}
	defer os.RemoveAll(staging)
	if fi, err := os.Lstat(staging); err != nil || !fi.IsDir() || fi.Mode()&fs.ModeSymlink != 0 {
		return nil, errors.New("the attempt's output dir is not a directory (a link?): outputs not kept")
	}
	var got []*apiaryv1.LocalDataset
	var errs []error
	for _, name := range names {
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") {
			continue
		}
		src := filepath.Join(staging, name)
		fi, err := os.Lstat(src)
		if err != nil || fi.Mode()&fs.ModeSymlink != 0 {
			continue
		}
		dst := filepath.Join(d.dir, name)
		if err := os.Mkdir(dst, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			errs = append(errs, fmt.Errorf("output %s: %w", name, err))
			continue
		}
		if err := mergeInto(src, fi, dst, name); err != nil {
			errs = append(errs, fmt.Errorf("output %s: %w", name, err))
			continue
		}
		got = append(got, &apiaryv1.LocalDataset{Name: name, SizeBytes: dirBytes(dst)})
	}
	d.rescan()
	return got, errors.Join(errs...)
}

// mergeInto moves src (described by fi) into the dataset directory dst: a
// directory's entries (links skipped), or the file itself as entry name.
func mergeInto(src string, fi fs.FileInfo, dst, name string) error {
	if !fi.IsDir() {
		return replaceEntry(src, filepath.Join(dst, name))
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.Type()&fs.ModeSymlink != 0 {
			continue
		}
		if err := replaceEntry(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// replaceEntry renames src to dst; an existing dst is removed only after
// the move can be made (src is renamed beside it first), so a failed move
// (another file system) leaves dst as it was.
func replaceEntry(src, dst string) error {
	tmp := dst + ".apiary-new"
	_ = os.RemoveAll(tmp)
	if err := os.Rename(src, tmp); err != nil {
		return err
	}
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// dirBytes is the bytes of the regular files under dir.
func dirBytes(dir string) int64 {
	var size int64
	_ = filepath.WalkDir(dir, func(_ string, de fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable parts count as empty
		}
		if de.Type().IsRegular() {
			if fi, err := de.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	return size
}

// datasetEnvName is the environment variable that gives a task the local
// path of dataset name: APIARY_DATASET_ and the name upper-cased, every
// character other than A-Z and 0-9 replaced by '_'.
func datasetEnvName(name string) string {
	var b strings.Builder
	b.WriteString("APIARY_DATASET_")
	for _, r := range strings.ToUpper(name) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// sameFileSystem reports whether a and b (or, for one that does not exist
// yet, its parent) are on one file system.
func sameFileSystem(a, b string) (bool, error) {
	dev := func(p string) (uint64, error) {
		for {
			fi, err := os.Stat(p)
			if err == nil {
				st, ok := fi.Sys().(*syscall.Stat_t)
				if !ok {
					return 0, errors.New("no device number")
				}
				return uint64(st.Dev), nil
			}
			parent := filepath.Dir(p)
			if !errors.Is(err, fs.ErrNotExist) || parent == p {
				return 0, err
			}
			p = parent
		}
	}
	da, err := dev(a)
	if err != nil {
		return false, err
	}
	db, err := dev(b)
	if err != nil {
		return false, err
	}
	return da == db, nil
}
