package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDatasetCacheScan: each subdirectory is a dataset sized by the bytes of
// its regular files (nested ones too, links not followed); files at the top,
// hidden directories and names the region would refuse are left out; a
// rescan bumps the version only when the list changed; path answers only
// for datasets held.
func TestDatasetCacheScan(t *testing.T) {
	dir := t.TempDir()
	write := func(rel string, n int) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("inputs-a/part-0", 1000)
	write("inputs-a/sub/part-1", 24)
	write("model/weights.bin", 4096)
	write("loose-file", 7)
	write(".hidden/x", 5)
	write("bad\nname/x", 5)
	if err := os.Symlink(filepath.Join(dir, "model/weights.bin"), filepath.Join(dir, "inputs-a/link")); err != nil {
		t.Fatal(err)
	}
	d := newDatasetCache(dir)
	list, v1 := d.snapshot()
	got := map[string]int64{}
	for _, x := range list {
		got[x.GetName()] = x.GetSizeBytes()
	}
	if len(got) != 2 || got["inputs-a"] != 1024 || got["model"] != 4096 {
		t.Fatalf("datasets %v, want inputs-a 1024 and model 4096 only", got)
	}
	d.rescan()
	if _, v := d.snapshot(); v != v1 {
		t.Fatalf("rescan without a change moved the version %d -> %d", v1, v)
	}
	write("model/more.bin", 4)
	d.rescan()
	list, v2 := d.snapshot()
	if v2 == v1 || list[1].GetSizeBytes() != 4100 {
		t.Fatalf("after a resize: version %d -> %d, list %v", v1, v2, list)
	}
	if p, ok := d.path("model"); !ok || p != filepath.Join(dir, "model") {
		t.Fatalf("path(model) = %q, %v", p, ok)
	}
	for _, name := range []string{"absent", "../model", ".", "", "inputs-a/sub"} {
		if _, ok := d.path(name); ok {
			t.Fatalf("path(%q) answered", name)
		}
	}
	var none *datasetCache
	if l, v := none.snapshot(); l != nil || v != 0 {
		t.Fatal("a node without a dataset dir reports datasets")
	}
	if _, ok := none.path("model"); ok {
		t.Fatal("a node without a dataset dir holds a dataset")
	}
}

func TestDatasetEnvName(t *testing.T) {
	for name, want := range map[string]string{"inputs-a": "APIARY_DATASET_INPUTS_A", "s3://b/x.parquet": "APIARY_DATASET_S3___B_X_PARQUET", "Model7": "APIARY_DATASET_MODEL7"} {
		if got := datasetEnvName(name); got != want {
			t.Errorf("datasetEnvName(%q) = %q, want %q", name, got, want)
		}
	}
	if !strings.HasPrefix(datasetEnvName("é"), "APIARY_DATASET_") {
		t.Error("non-ASCII name")
	}
}

// TestDatasetPublish: an attempt's outputs (a directory, a file) move into
// the dataset directory, merged into a dataset of the same name (its other
// entries stay: part files of several attempts), with their sizes; names
// it did not write, symbolic links and names not asked for are left alone;
// the cache knows them at once; the output dir is gone afterwards.
func TestDatasetPublish(t *testing.T) {
	root := t.TempDir()
	dsDir, out, staging := filepath.Join(root, "datasets"), filepath.Join(root, "work", "outputs"), filepath.Join(root, "staging", "a")
	if err := os.MkdirAll(filepath.Dir(staging), 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(p string, n int) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for p, n := range map[string]int{"table/part-0": 100, "table/part-1": 23, "model.bin": 7, "extra/x": 1} {
		write(filepath.Join(out, p), n)
	}
	if err := os.Symlink("/etc", filepath.Join(out, "link")); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(dsDir, "table", "part-9"), 900)  // another attempt's part: kept
	write(filepath.Join(dsDir, "table", "part-0"), 5000) // an older part-0: replaced
	d := newDatasetCache(dsDir)
	got, err := d.publish(out, staging, []string{"table", "model.bin", "missing", "link", "../escape"})
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int64{}
	for _, o := range got {
		sizes[o.GetName()] = o.GetSizeBytes()
	}
	if len(sizes) != 2 || sizes["table"] != 1023 || sizes["model.bin"] != 7 {
		t.Fatalf("published %v, want table 1023 (part-0 replaced, part-9 kept) and model.bin 7", sizes)
	}
	if _, err := os.Stat(filepath.Join(dsDir, "model.bin", "model.bin")); err != nil {
		t.Fatalf("a file output is not the one file of its dataset dir: %v", err)
	}
	if _, ok := d.path("table"); !ok {
		t.Fatal("the cache does not hold the published dataset")
	}
	if _, err := os.Lstat(filepath.Join(dsDir, "link")); err == nil {
		t.Fatal("a symbolic link was published")
	}
	if _, err := os.Lstat(out); err == nil {
		t.Fatal("the output dir is still there")
	}
}

// TestDatasetPublishRefusesLinkedOutputDir: an attempt that replaced its
// output dir by a link to a directory it cannot read gets nothing of that
// directory moved (the agent runs as root: it could).
func TestDatasetPublishRefusesLinkedOutputDir(t *testing.T) {
	root := t.TempDir()
	victim := filepath.Join(root, "victim")
	if err := os.MkdirAll(filepath.Join(victim, "secret"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim, "secret", "key"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "work", "outputs")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, out); err != nil {
		t.Fatal(err)
	}
	d := newDatasetCache(filepath.Join(root, "datasets"))
	got, err := d.publish(out, filepath.Join(root, "staging"), []string{"secret"})
	if err == nil || len(got) != 0 {
		t.Fatalf("published %v, err %v; want nothing and an error", got, err)
	}
	if _, err := os.Stat(filepath.Join(victim, "secret", "key")); err != nil {
		t.Fatalf("the link's target lost its file: %v", err)
	}
}
