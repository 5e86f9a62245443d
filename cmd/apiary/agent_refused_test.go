package main

// An agent that its region refuses (issue 19 follow-ups from a new-user
// test), with real regions, agents and task processes: a revoked join token
// kills the node's attempts at once (the region has placed them elsewhere)
// and lets the agent stop promptly; an agent left out of an encrypted LAN
// pool says why in its own log.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/testutil"
)

// pidGone reports whether pid no longer runs (absent, or a zombie nobody
// reaped yet).
func pidGone(pid int) bool {
	if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

// linesWith returns the lines of the file at path that contain every one
// of subs.
func linesWith(t *testing.T, path string, subs ...string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// TestRevokedAgentKillsItsAttempts: revoking the join token of a node
// whose agent runs a task ends the node's epoch at once, and the region
// places the task on the other node. The agent's re-registration is
// refused ("join_token: no such token"), so no epoch can adopt its attempt:
// it kills the task's process within a few seconds (not after the task's 60
// s) and never reports it, logging one ERROR that says so; the task
// completes exactly once, on the other node. The refused agent keeps
// running (retrying), and on SIGTERM stops within a few seconds, saying
// what it waits for.
func TestRevokedAgentKillsItsAttempts(t *testing.T) {
	agents := []devcluster.AgentSpec{{ID: "eu-n1", CPUMillis: 1000, MemoryMiB: 1024}, {ID: "eu-n2", CPUMillis: 1000, MemoryMiB: 1024}}
	// No failover grace: the region, just started, replaces the lost
	// epoch's task at once.
	cl := aclCluster(t, false, devcluster.RegionSpec{Name: "eu-west", Jurisdiction: "eu", Agents: agents,
		ExtraArgs: []string{"--failover-grace", "0s"}})
	eu := cl.Regions[0]
	env := append(cl.ClientEnv(), cliconn.EnvAddr+"="+eu.Addr())
	dir := t.TempDir()
	// The first attempt to start claims the task (mkdir), then says where
	// and sleeps; any other completes it and says where. The pid is
	// written only after the claim: a CI run revoked between the two (the
	// claim is a fork+exec of mkdir, slow under load), the claim never
	// happened and the second attempt slept instead.
	script := fmt.Sprintf(`if mkdir %[1]s/first 2>/dev/null; then echo "$APIARY_NODE_ID $$" >> %[1]s/pids; exec sleep 60; fi; echo "$APIARY_NODE_ID" >> %[1]s/done`, dir)
	job := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(job, []byte(fmt.Sprintf("name: revoked\ntasks:\n  - name: t\n    command: sh\n    args: [\"-c\", %q]\n", script)), 0o644); err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(mustCLI(t, env, "job", "run", job).stdout)

	var victim string
	var pid int
	testutil.Eventually(t, 20*time.Second, "the first attempt running", func() error {
		b, err := os.ReadFile(filepath.Join(dir, "pids"))
		if err != nil {
			return err
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return fmt.Errorf("pids: %q", b)
		}
		victim = f[0]
		pid, err = strconv.Atoi(f[1])
		return err
	})
	other := map[string]string{"eu-n1": "eu-n2", "eu-n2": "eu-n1"}[victim]
	if other == "" || pidGone(pid) {
		t.Fatalf("attempt 1 on %q, pid %d (gone: %v)", victim, pid, pidGone(pid))
	}

	conn, err := eu.Dial() // the management token
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	toks, err := apiaryv1.NewACLServiceClient(conn).ListACLTokens(ctx, &apiaryv1.ListACLTokensRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var accessor string
	for _, tk := range toks.GetTokens() {
		if tk.GetType() == acl.TypeAgent && tk.GetNodeId() == victim {
			accessor = tk.GetAccessorId()
		}
	}
	if accessor == "" {
		t.Fatalf("no join token bound to %s in %v", victim, toks.GetTokens())
	}
	revoked := time.Now()
	mustCLI(t, env, "acl", "token", "revoke", accessor)

	testutil.Eventually(t, 5*time.Second, victim+" killing the revoked epoch's attempt (pid "+strconv.Itoa(pid)+")", func() error {
		if !pidGone(pid) {
			return fmt.Errorf("pid %d still runs", pid)
		}
		return nil
	})
	t.Logf("revocation to the attempt's process gone: %s", time.Since(revoked).Round(time.Millisecond))

	jobs := apiaryv1.NewJobServiceClient(conn)
	var done *apiaryv1.Job
	testutil.Eventually(t, 30*time.Second, "the job complete", func() error {
		resp, err := jobs.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: id})
		if err != nil {
			return err
		}
		if done = resp.GetJob(); done.GetState() != apiaryv1.JobState_JOB_STATE_COMPLETE {
			return fmt.Errorf("job %s", done.GetState())
		}
		return nil
	})
	t.Logf("revocation to the job complete on %s: %s", other, time.Since(revoked).Round(time.Millisecond))
	if tk := done.GetTasks()[0]; tk.GetNodeId() != other {
		t.Errorf("completed on %s (attempt %d), want %s", tk.GetNodeId(), tk.GetAttempt(), other)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "done")); err != nil || string(b) != other+"\n" {
		t.Errorf("the task's completions: %q (%v); want one, on %s", b, err, other)
	}

	log := eu.Agent(victim).LogPath
	if got := linesWith(t, log, "level=ERROR", "registration refused: join_token: no such token"); len(got) != 1 {
		t.Errorf("%d ERRORs of the refusal, want 1:\n%s", len(got), strings.Join(got, "\n"))
	}
	killed := linesWith(t, log, "level=ERROR", "killed them at once, unreported")
	if len(killed) != 1 || !strings.Contains(killed[0], "running_killed=1") {
		t.Errorf("want one ERROR saying the attempt was killed, got:\n%s", strings.Join(killed, "\n"))
	}
	if !eu.Agent(victim).Running() {
		t.Fatalf("the refused agent exited; it must keep retrying")
	}

	stopping := time.Now()
	eu.Agent(victim).Stop(20 * time.Second)
	took := time.Since(stopping)
	t.Logf("SIGTERM to exit of the refused agent: %s", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("the refused agent took %s to stop, want < 5 s", took.Round(time.Millisecond))
	}
	for _, want := range []string{"stopping: the node holds no epoch", "stopping: no epoch to release", "agent stopped"} {
		if len(linesWith(t, log, want)) == 0 {
			t.Errorf("the agent's log does not say %q", want)
		}
	}
}

// startLogged starts the apiary binary with args, its output in the file
// at logPath, and kills it at test end.
func startLogged(t *testing.T, logPath string, args ...string) {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testutil.Binary(t), args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// TestAgentOutOfEncryptedLANPoolSaysWhy: in a region whose LAN pool is
// encrypted (--gossip-key), an agent started without the key and one with
// another key still register (liveness falls back to the lease), and each
// says in its own log, at ERROR and once (not at every try of the join,
// about one a second), that it cannot join the pool, why, and which flag
// fixes it.
func TestAgentOutOfEncryptedLANPoolSaysWhy(t *testing.T) {
	key, err := federation.GenerateGossipKey()
	if err != nil {
		t.Fatal(err)
	}
	other, err := federation.GenerateGossipKey()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := devcluster.Start(ctx, devcluster.Options{Binary: testutil.Binary(t), Dir: dir, GossipKey: key,
		Regions: []devcluster.RegionSpec{{Name: "eu-west", Jurisdiction: "eu"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	eu := cl.Regions[0]
	start := func(id string, extra ...string) string {
		logPath := filepath.Join(dir, id+".log")
		startLogged(t, logPath, append([]string{"agent", "--addr", eu.Addr(), "--node-id", id, "--data-dir", filepath.Join(dir, id),
			"--cpu-millis", "1000", "--memory-mb", "1024", "--insecure-dev"}, extra...)...)
		return logPath
	}
	t.Setenv("APIARY_GOSSIP_KEY", "") // not inherited by the keyless agent
	os.Unsetenv("APIARY_GOSSIP_KEY")
	cases := []struct{ log, cause string }{
		{start("eu-nokey"), "the region's LAN pool is encrypted and this agent has no gossip key: give it the region's key as --gossip-key or $APIARY_GOSSIP_KEY"},
		{start("eu-otherkey", "--gossip-key", other), "the region's LAN pool is encrypted with a key this agent does not hold: give it the region's key as --gossip-key or $APIARY_GOSSIP_KEY"},
	}
	if err := eu.WaitNodes(ctx, 2); err != nil {
		t.Fatalf("the agents out of the pool must still register: %v", err)
	}
	// The coordinator refuses every try of each agent's join (about one a
	// second each): once it has refused several, each agent has retried.
	coordLog := eu.Coords[0].LogPath
	testutil.Eventually(t, 20*time.Second, "the coordinator refusing several joins", func() error {
		if n := len(linesWith(t, coordLog, "memberlist")); n < 6 {
			return fmt.Errorf("%d memberlist errors in the coordinator's log", n)
		}
		return nil
	})
	for _, c := range cases {
		got := linesWith(t, c.log, "cannot join the region's LAN pool")
		if len(got) != 1 || !strings.Contains(got[0], "level=ERROR") || !strings.Contains(got[0], c.cause) {
			b, _ := os.ReadFile(c.log)
			t.Errorf("%s: want one ERROR saying %q, got %d:\n%s\n--- log ---\n%s", filepath.Base(c.log), c.cause, len(got), strings.Join(got, "\n"), b)
		}
	}
}
