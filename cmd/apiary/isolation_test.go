package main

// Task users end to end (issue 19's HIGH finding): with mutual TLS, ACLs
// and an encrypted gossip pool, as `apiary dev --tls` runs them, a task
// cannot read another namespace's secret_env value from the other task's
// /proc/<pid>/environ, nor the agent's gossip key, join token or TLS key;
// and no process of the cluster has the gossip key on its command line.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

// searchableTempDir is a new test directory that every user may search
// (not list) down to: t.TempDir's parent is 0700.
func searchableTempDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for _, p := range []string{filepath.Dir(d), d} {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// procWithEnv returns the pid of the process whose environment holds kv.
func procWithEnv(kv string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		for _, v := range bytes.Split(env, []byte{0}) {
			if string(v) == kv {
				return pid
			}
		}
	}
	return 0
}

// TestTaskUsersKeepSecretsFromOtherTasks: a region with TLS, ACLs and a
// gossip key (as apiary dev --tls), one agent run as root. Job a (namespace
// a) holds a secret_env value; job b (namespace b), on the same agent, reads
// /proc/<pid of a's task>/environ, the agent's gossip keyring, join token
// and TLS key, and the agent's command line: every file read is refused,
// the command line holds no key, and b's own work completes.
func TestTaskUsersKeepSecretsFromOtherTasks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("task users need an agent run as root (CI runs as root)")
	}
	key, err := federation.GenerateGossipKey()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(searchableTempDir(t), "cluster")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, err := devcluster.Start(ctx, devcluster.Options{Binary: testutil.Binary(t), Dir: dir, TLS: true, ACL: true, GossipKey: key,
		Regions: []devcluster.RegionSpec{{Name: "eu-west", Jurisdiction: "eu", Agents: []devcluster.AgentSpec{{ID: "eu-n1"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	eu := cl.Regions[0]
	agentLog := eu.Agents[0].LogPath
	t.Cleanup(func() {
		cl.Stop()
		if b, err := os.ReadFile(agentLog); err == nil && t.Failed() {
			t.Logf("--- agent log ---\n%s", b[max(0, len(b)-4000):])
		}
	})
	if b, _ := os.ReadFile(agentLog); !strings.Contains(string(b), "attempts run as users of their own") {
		t.Fatalf("the agent does not run tasks as users of their own:\n%s", b)
	}
	for _, p := range append(slices.Clone(eu.Coords), eu.Agents[0]) {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(cmdline, []byte(key)) || bytes.Contains(cmdline, []byte("--gossip-key")) {
			t.Errorf("%s: the gossip key is on its command line: %q", p.Name, cmdline)
		}
	}

	env := append(cl.ClientEnv(), "APIARY_ADDR="+eu.Addr())
	work := t.TempDir()
	jobA := filepath.Join(work, "a.yaml")
	if err := os.WriteFile(jobA, []byte("name: holder\nnamespace: a\ntasks:\n  - name: t\n    command: sleep\n    args: [\"60\"]\n"+
		"    env:\n      DB_PASSWORD: {value: hunter2-secret, secret: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	idA := strings.TrimSpace(mustCLI(t, env, "job", "run", jobA).stdout)
	var pidA int
	testutil.Eventually(t, 20*time.Second, "job a's task running", func() error {
		if pidA = procWithEnv("APIARY_JOB_ID=" + idA); pidA == 0 {
			return fmt.Errorf("no process of %s", idA)
		}
		return nil
	})
	if env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pidA)); !bytes.Contains(env, []byte("DB_PASSWORD=hunter2-secret")) {
		t.Fatal("job a's task lacks its secret; the test proves nothing")
	}

	tlsKey, err := cl.PKI().Cert(pki.RoleAgent, "eu-west", "eu-n1")
	if err != nil {
		t.Fatal(err)
	}
	reads := map[string]string{
		"environ": fmt.Sprintf("/proc/%d/environ", pidA),
		"keyring": filepath.Join(dir, "eu-n1", "gossip.keyring"),
		"token":   filepath.Join(dir, devcluster.ACLDir, "eu-n1.token"),
		"tlskey":  tlsKey.Key,
	}
	script := ""
	for name, path := range reads {
		script += fmt.Sprintf("cat %s; echo %s=$?; ", path, name)
	}
	script += fmt.Sprintf("tr '\\0' ' ' < /proc/%d/cmdline; echo; echo own-work > mine && cat mine", eu.Agents[0].Pid())
	jobB := filepath.Join(work, "b.yaml")
	if err := os.WriteFile(jobB, []byte(fmt.Sprintf("name: reader\nnamespace: b\ntasks:\n  - name: t\n    command: sh\n    args: [\"-c\", %q]\n", script)), 0o644); err != nil {
		t.Fatal(err)
	}
	idB := strings.TrimSpace(mustCLI(t, env, "job", "run", jobB).stdout)
	var status string
	testutil.Eventually(t, 30*time.Second, "job b ended", func() error {
		status = runCLI(t, env, "job", "status", idB).stdout
		if !strings.Contains(status, "COMPLETE") && !strings.Contains(status, "FAILED") {
			return fmt.Errorf("job status: %s", status)
		}
		return nil
	})
	logs := mustCLI(t, env, "job", "logs", idB).stdout
	t.Logf("job b's logs:\n%s", logs)
	if !strings.Contains(status, "State:      COMPLETE") {
		t.Errorf("job b did not complete:\n%s", status)
	}
	if strings.Contains(logs, "hunter2") || strings.Contains(logs, key) || strings.Contains(logs, "PRIVATE KEY") {
		t.Fatal("job b read a secret of job a or of the agent")
	}
	for name, path := range reads {
		if !strings.Contains(logs, name+"=1") || !strings.Contains(logs, path+": Permission denied") {
			t.Errorf("%s (%s): not refused with Permission denied", name, path)
		}
	}
	if !strings.Contains(logs, "apiary agent") || !strings.Contains(logs, "own-work") {
		t.Error("job b's own work did not run")
	}
	mustCLI(t, env, "job", "cancel", idA)
}

// TestAgentWithoutRootWarns: an agent that does not run as root (here as
// nobody when the test runs as root, else as the test's own user) says at
// start, at WARN, that its tasks run as its own user and can read its
// credentials and each other's environment.
func TestAgentWithoutRootWarns(t *testing.T) {
	dir := searchableTempDir(t)
	bin := filepath.Join(dir, "apiary") // reachable by nobody: testutil's build dir is 0700
	if err := os.Link(testutil.Binary(t), bin); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "agent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "agent", "--insecure-dev", "--addr", closedAddr(t), "--node-id", "n1", "--data-dir", data,
		"--lan-addr", "off", "--cpu-millis", "1000", "--memory-mb", "512")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		const nobody = 65534
		if err := os.Chown(data, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	want := "tasks run as the agent's own user: they can read its credentials (TLS key, join token, gossip keyring) and each other's environment"
	testutil.Eventually(t, 20*time.Second, "the warning", func() error {
		for _, l := range linesWith(t, logPath, want) {
			if strings.Contains(l, "level=WARN") && strings.Contains(l, "does not run as root") {
				return nil
			}
		}
		b, _ := os.ReadFile(logPath)
		return fmt.Errorf("no WARN saying %q in:\n%s", want, b)
	})
}
