package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSweepWorkDirs: attempt directories unchanged for longer than
// WorkRetention go, with the task and job directories they leave empty;
// recent ones, ones with a recently written file, and running attempts stay.
func TestSweepWorkDirs(t *testing.T) {
	dir := t.TempDir()
	a, err := New(Config{NodeID: "n1", DataDir: dir, CoordinatorAddrs: []string{"127.0.0.1:1"},
		Capacity: Resources{CPUMillis: 1000, MemoryMB: 1024}, WorkRetention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	old := now.Add(-2 * time.Hour)
	mk := func(rel string, fileTime, dirTime time.Time) string {
		d := filepath.Join(dir, "work", rel)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(d, "stdout.log")
		if err := os.WriteFile(f, []byte("out"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f, fileTime, fileTime); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(d, dirTime, dirTime); err != nil {
			t.Fatal(err)
		}
		return d
	}
	gone := mk("j1/0/1", old, old)    // finished long ago: removed, and j1 with it
	recent := mk("j2/0/1", now, now)  // finished just now: kept
	written := mk("j2/1/1", now, old) // its log changed recently: kept
	running := mk("j3/0/2", old, old) // old but still running: kept
	a.seen = map[AttemptKey]*attemptState{{JobID: "j3", TaskIndex: 0, Attempt: 2}: {}}

	if n := a.sweepWorkDirs(now); n != 1 {
		t.Fatalf("removed %d attempt dirs, want 1", n)
	}
	for _, d := range []string{gone, filepath.Join(dir, "work", "j1")} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("%s still there (err %v)", d, err)
		}
	}
	for _, d := range []string{recent, written, running} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("%s removed: %v", d, err)
		}
	}
	// Once the attempt has finished and the retention has passed, it goes too.
	a.seen[AttemptKey{JobID: "j3", TaskIndex: 0, Attempt: 2}].finished = now
	if n := a.sweepWorkDirs(now); n != 1 {
		t.Fatalf("second sweep removed %d, want 1 (the finished j3 attempt)", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "work", "j3")); !os.IsNotExist(err) {
		t.Fatalf("j3 dir still there (err %v)", err)
	}
}

// TestWorkRetentionDefault: 0 means the default; negative keeps everything.
func TestWorkRetentionDefault(t *testing.T) {
	a, err := New(Config{NodeID: "n1", DataDir: t.TempDir(), CoordinatorAddrs: []string{"127.0.0.1:1"},
		Capacity: Resources{CPUMillis: 1000, MemoryMB: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	if a.Config().WorkRetention != DefaultWorkRetention {
		t.Fatalf("WorkRetention %v, want %v", a.Config().WorkRetention, DefaultWorkRetention)
	}
}
