package agent

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, cond func() bool, what string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for "+what, append([]any{d}, args...)...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// processGone reports whether pid no longer runs (absent, or a zombie that
// nobody reaped yet: an orphan reparented to a PID 1 that does not reap).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	state := s[i+2]
	return state == 'Z' || state == 'X'
}

// readPids waits until file holds n lines of pids and returns them.
func readPids(t *testing.T, file string, n int) []int {
	t.Helper()
	var pids []int
	waitFor(t, 10*time.Second, func() bool {
		b, err := os.ReadFile(file)
		if err != nil {
			return false
		}
		lines := strings.Fields(string(b))
		if len(lines) < n {
			return false
		}
		pids = pids[:0]
		for _, l := range lines[:n] {
			p, err := strconv.Atoi(l)
			if err != nil {
				return false
			}
			pids = append(pids, p)
		}
		return true
	}, "%d pids in %s", n, file)
	return pids
}
