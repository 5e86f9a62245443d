package agent

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestKillOrphans: a process group left in an attempt dir by a previous run
// is killed; a process group leader running elsewhere is not.
func TestKillOrphans(t *testing.T) {
	data := t.TempDir()
	dir := filepath.Join(data, "work", "eu-job", "0", "1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	orphan := exec.Command("sh", "-c", "sleep 30 & wait")
	orphan.Dir = dir
	orphan.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- orphan.Wait() }()
	// A stranger: a live process whose cwd is not the attempt dir.
	other := filepath.Join(data, "work", "eu-job", "1", "1")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	stranger := exec.Command("sleep", "30")
	stranger.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-stranger.Process.Pid, syscall.SIGKILL); _ = stranger.Wait() }()
	if n := killOrphans(data, slog.New(slog.NewTextHandler(io.Discard, nil))); n != 1 {
		t.Fatalf("killed %d groups, want 1", n)
	}
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("orphan still running")
	}
	if err := syscall.Kill(stranger.Process.Pid, 0); err != nil {
		t.Fatalf("stranger was killed: %v", err)
	}
}
