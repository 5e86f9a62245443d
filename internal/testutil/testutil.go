// Package testutil holds helpers shared by integration tests: building the
// apiary binary once per test binary, and waiting on conditions. It is
// imported only from _test.go files.
package testutil

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// Expectation is what a malformed job file under
// internal/jobspec/testdata/malformed says about itself in its first line:
// "# expect: FIELD" (an error must name FIELD) or "# expect-message: TEXT"
// (the message must contain TEXT).
type Expectation struct {
	Field   string
	Message string
}

// Text is what the error output must contain: "FIELD: " or TEXT.
func (e Expectation) Text() string {
	if e.Field != "" {
		return e.Field + ": "
	}
	return e.Message
}

// ReadExpectation reads a malformed job file's expectation line; a file
// without one fails the test.
func ReadExpectation(t testing.TB, path string) Expectation {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line, _ := bufio.NewReader(f).ReadString('\n')
	line = strings.TrimSpace(line)
	if v, ok := strings.CutPrefix(line, "# expect: "); ok {
		return Expectation{Field: v}
	}
	if v, ok := strings.CutPrefix(line, "# expect-message: "); ok {
		return Expectation{Message: v}
	}
	t.Fatalf("%s: first line must be '# expect: FIELD' or '# expect-message: TEXT', got %q", path, line)
	return Expectation{}
}
