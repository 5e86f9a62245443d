package regional_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// TestAgentRestartKillsCgroupLeftovers: a task's child leaves everything
// the record-based sweep looks for (its process group and session with
// setsid, its work dir, its environment with env -i); the agent is
// SIGKILLed and restarted with the same data dir. With cgroups, the
// restarted agent finds the child in the previous run's attempt cgroup and
// kills it before running anything; the job then completes on attempt 2.
// Where the host has no usable cgroups (the agent's log says which), the
// README's fallback holds: the child survives the restart.
func TestAgentRestartKillsCgroupLeftovers(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{{ID: "n1"}}})
	c := dial(t, r)
	p := filepath.Join(t.TempDir(), "P")
	id := submit(t, c, spec(t, fmt.Sprintf(`
name: escape
max_attempts: 3
tasks:
  - name: work
    command: sh
    args: ["-c", "if [ \"$APIARY_ATTEMPT\" = 1 ]; then setsid env -i /bin/sh -c 'cd / && echo $$ > %[1]s.tmp && mv %[1]s.tmp %[1]s && exec sleep 60' & sleep 60; fi"]
`, p)))
	var esc int
	testutil.Eventually(t, 20*time.Second, "attempt 1's escapee running", func() error {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		esc, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	t.Cleanup(func() { _ = syscall.Kill(esc, syscall.SIGKILL) })
	victim := r.Agents[0]
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	if !alive(esc) {
		t.Fatal("the escapee died with the agent; the test proves nothing")
	}
	log, _ := os.ReadFile(victim.LogPath)
	cgroups := strings.Contains(string(log), "attempts run in cgroups")
	if !cgroups && !strings.Contains(string(log), "no cgroups for attempts") {
		t.Fatalf("the agent's log says nothing about cgroups:\n%s", log)
	}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 40*time.Second)
	if a := j.GetTasks()[0].GetAttempt(); a < 2 {
		t.Fatalf("completed by attempt %d, want a later one", a)
	}
	if !cgroups {
		t.Log("no usable cgroups on this host: the escapee must outlive the restart (README)")
		if !alive(esc) {
			t.Fatal("the escapee was killed without cgroups?")
		}
		return
	}
	// The sweep ran before the restarted agent registered, so before
	// attempt 2 could run.
	if alive(esc) {
		t.Fatalf("escapee %d outlived the restart", esc)
	}
}
