package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
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
	list, _ := d.snapshot()
	if _, ok := slices.BinarySearchFunc(list, name, func(x *apiaryv1.LocalDataset, n string) int { return strings.Compare(x.GetName(), n) }); !ok {
		return "", false
	}
	return filepath.Join(d.dir, name), true
}

// run rescans every interval until ctx ends.
func (d *datasetCache) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.rescan()
		}
	}
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
		// The region's rules for a dataset name (regional checkDatasets):
		// 1-512 printable characters; at most maxDatasets.
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || len(e.Name()) > 512 ||
			!utf8.ValidString(e.Name()) || strings.ContainsFunc(e.Name(), unicode.IsControl) {
			continue
		}
		if len(out) == maxDatasets {
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
// directory, replacing a dataset of the same name, and returns them with
// their sizes; then it rescans. A directory becomes the dataset; a file
// becomes the one file of a dataset directory of the same name. A name the
// attempt did not write, or wrote as a symbolic link, is skipped; a move
// that fails (another file system: rename cannot cross it) is logged by the
// caller through err and skipped.
func (d *datasetCache) publish(out string, names []string) ([]*apiaryv1.LocalDataset, error) {
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return nil, err
	}
	var got []*apiaryv1.LocalDataset
	var errs []error
	for _, name := range names {
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") {
			continue
		}
		src := filepath.Join(out, name)
		fi, err := os.Lstat(src)
		if err != nil || fi.Mode()&fs.ModeSymlink != 0 {
			continue
		}
		dst := filepath.Join(d.dir, name)
		if err := os.RemoveAll(dst); err != nil {
			errs = append(errs, err)
			continue
		}
		if fi.IsDir() {
			err = os.Rename(src, dst)
		} else if err = os.Mkdir(dst, 0o755); err == nil {
			err = os.Rename(src, filepath.Join(dst, name))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("output %s: %w", name, err))
			continue
		}
		got = append(got, &apiaryv1.LocalDataset{Name: name, SizeBytes: dirBytes(dst)})
	}
	d.rescan()
	return got, errors.Join(errs...)
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
