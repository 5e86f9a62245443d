// Package testutil holds helpers shared by integration tests: building the
// apiary binary once per test binary, and waiting on conditions. It is
// imported only from _test.go files.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

// Binary builds apiary.dev/apiary/cmd/apiary once and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "apiary-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "apiary")
		cmd := exec.Command("go", "build", "-o", binPath, "apiary.dev/apiary/cmd/apiary")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// Cleanup removes the built binary; call it from TestMain after m.Run.
func Cleanup() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// Eventually polls cond every 25 ms until it returns nil or timeout passes,
// then fails the test with the last error.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = cond(); last == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %v", what, timeout, last)
		}
		time.Sleep(25 * time.Millisecond)
	}
}
