package regional_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// TestAgentRestartKillsOrphanedChildren is issue 20's reproduction: a task
// whose main process waits on a child; the agent is SIGKILLed while the
// child sleeps (Pdeathsig kills only the main process) and restarted at
// once with the same data dir. The restarted agent must kill the killed
// run's processes before they have an effect, so `effect` is written once,
// by the attempt that counts. Before the fix the start-up sweep skipped the
// child (not a group leader) and both attempts wrote it.
func TestAgentRestartKillsOrphanedChildren(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{{ID: "n1"}}})
	c := dial(t, r)
	dir := t.TempDir()
	l := filepath.Join(dir, "L")
	id := submit(t, c, spec(t, fmt.Sprintf(`
name: orphan
max_attempts: 3
tasks:
  - name: work
    command: sh
    args: ["-c", "echo start >> %[1]s; (sleep 3; echo effect >> %[1]s)"]
`, l)))
	testutil.Eventually(t, 20*time.Second, "attempt 1 started its child", func() error {
		b, _ := os.ReadFile(l)
		if strings.Count(string(b), "start") != 1 {
			return fmt.Errorf("L holds %q", b)
		}
		if len(attemptProcs(id, 1)) < 2 {
			return fmt.Errorf("attempt 1 runs %v", attemptProcs(id, 1))
		}
		return nil
	})
	victim := r.Agents[0]
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	left := attemptProcs(id, 1)
	if len(left) == 0 {
		t.Fatal("no process of attempt 1 outlived the agent; the test proves nothing")
	}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	// Within the child's 3 s sleep: the restarted agent's sweep kills them.
	testutil.Eventually(t, 20*time.Second, "attempt 1's processes gone", func() error {
		if ps := attemptProcs(id, 1); len(ps) > 0 {
			return fmt.Errorf("still running: %v", ps)
		}
		return nil
	})
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 40*time.Second)
	if a := j.GetTasks()[0].GetAttempt(); a < 2 {
		t.Fatalf("completed by attempt %d, want a later one", a)
	}
	b, _ := os.ReadFile(l)
	if n := strings.Count(string(b), "effect"); n != 1 {
		t.Fatalf("effect written %d times, want 1; L:\n%s", n, b)
	}
}

// attemptProcs returns the live (non-zombie) processes whose environment
// says they belong to attempt `attempt` of job id's task 0.
func attemptProcs(id string, attempt int) []int { return taskProcs(id, 0, attempt) }

// procsWithEnv returns the live (non-zombie) processes whose environment
// holds every one of the given NAME=value entries.
func procsWithEnv(entries ...string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		vars := bytes.Split(env, []byte{0})
		match := true
		for _, w := range entries {
			found := false
			for _, v := range vars {
				if bytes.Equal(v, []byte(w)) {
					found = true
				}
			}
			match = match && found
		}
		if !match {
			continue
		}
		if alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// alive reports whether pid runs (exists and is not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}
