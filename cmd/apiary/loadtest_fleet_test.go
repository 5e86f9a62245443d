package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/loadtest"
)

// TestLoadtestFleet runs `apiary loadtest fleet` with 50 simulated agents
// against a real one-coordinator region: all 50 are READY in `node list`
// with the fleet's capacity, a 500-task job whose command does not exist
// completes on them (`job run --wait`), the progress lines count the
// attempts and the harness's CPU, and SIGTERM deregisters every agent (no
// node READY afterwards) and exits 0.
func TestLoadtestFleet(t *testing.T) {
	bin := testutil.Binary(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := devcluster.Start(ctx, devcluster.Options{Binary: bin, Dir: dir,
		Regions: []devcluster.RegionSpec{{Name: "eu-west", Jurisdiction: "eu", ExtraArgs: []string{"--node-lease-ttl", "2s"}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Stop()
	addr := cl.Regions[0].Addr()

	fleet := exec.Command(bin, "loadtest", "fleet", "--agents", "50", "--region", addr, "--node-prefix", "fl",
		"--label", "pool=sim", "--cpu-millis", "2000", "--memory-mb", "4096", "--max-tasks", "8",
		"--every", "500ms", "--data-dir", filepath.Join(dir, "fleet"), "-o", "json", "--log-level", "warn")
	stdout, err := fleet.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	fleet.Stderr = &stderr
	if err := fleet.Start(); err != nil {
		t.Fatal(err)
	}
	defer fleet.Process.Kill()
	var (
		mu      sync.Mutex
		samples []loadtest.FleetSample
		readErr error
	)
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var s loadtest.FleetSample
			err := json.Unmarshal(sc.Bytes(), &s)
			mu.Lock()
			samples = append(samples, s)
			if err != nil && readErr == nil {
				readErr = fmt.Errorf("line %q: %w", sc.Text(), err)
			}
			mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	last := func() (loadtest.FleetSample, int) {
		mu.Lock()
		defer mu.Unlock()
		if readErr != nil {
			t.Fatal(readErr)
		}
		if len(samples) == 0 {
			return loadtest.FleetSample{}, 0
		}
		return samples[len(samples)-1], len(samples)
	}
	nodes := func() map[string]*apiaryv1.Node {
		out, err := exec.Command(bin, "node", "list", "-o", "json", "--addr", addr).Output()
		if err != nil {
			t.Fatalf("node list: %v", err)
		}
		var resp apiaryv1.ListNodesResponse
		if err := protojson.Unmarshal(out, &resp); err != nil {
			t.Fatalf("node list -o json: %v\n%s", err, out)
		}
		m := map[string]*apiaryv1.Node{}
		for _, n := range resp.GetNodes() {
			m[n.GetId()] = n
		}
		return m
	}

	testutil.Eventually(t, 30*time.Second, "50 fleet nodes READY in node list", func() error {
		ready := 0
		for id, n := range nodes() {
			if n.GetStatus() == apiaryv1.NodeStatus_NODE_STATUS_READY && strings.HasPrefix(id, "fl-") {
				ready++
			}
		}
		if ready != 50 {
			return fmt.Errorf("%d READY", ready)
		}
		return nil
	})
	n := nodes()["fl-49"]
	if n.GetCapacity().GetCpuMillis() != 2000 || n.GetCapacity().GetMemoryMb() != 4096 || n.GetMaxTasks() != 8 || n.GetLabels()["pool"] != "sim" {
		t.Fatalf("node fl-49: %v", n)
	}

	job := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(job, []byte(`name: fleet-500
max_attempts: 1
tasks:
  - name: t
    count: 500
    command: /nonexistent/apiary-fleet-probe
    resources:
      cpu_millis: 100
      memory_mb: 32
`), 0o644); err != nil {
		t.Fatal(err)
	}
	run := exec.Command(bin, "job", "run", job, "--wait", "--addr", addr)
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("job run --wait: %v\n%s\nfleet stderr:\n%s", err, out, stderr.String())
	}
	testutil.Eventually(t, 10*time.Second, "the fleet's progress counts 500 attempts", func() error {
		if s, _ := last(); s.AttemptsEnded < 500 || s.Registered != 50 || s.Heartbeats == 0 || s.HarnessCPUSeconds <= 0 {
			return fmt.Errorf("last sample %+v", s)
		}
		return nil
	})

	if err := fleet.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { <-read; done <- fleet.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("fleet exited with %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("fleet did not stop within 20s of SIGTERM\n%s", stderr.String())
	}
	final, count := last()
	if !final.Final || final.Started != 50 || final.Registered != 0 || final.EverRegistered != 50 || final.AllRegisteredAfter <= 0 ||
		final.AttemptsStarted != final.AttemptsEnded || final.Failed != 0 || count < 3 {
		t.Fatalf("final sample %+v after %d samples", final, count)
	}
	for id, n := range nodes() {
		if n.GetStatus() == apiaryv1.NodeStatus_NODE_STATUS_READY {
			t.Fatalf("node %s still READY after the fleet stopped (not deregistered)", id)
		}
	}

	// A storm: 100 agents registering at once and leaving together 3 s
	// later (hundreds of watch cancellations at once). The region must go
	// on scheduling: it once froze here for good (etcd's in-process watch
	// stream deadlocked; the per-agent watches now use a gRPC client).
	storm := exec.Command(bin, "loadtest", "fleet", "--agents", "100", "--region", addr, "--node-prefix", "st",
		"--start-rate", "0", "--duration", "3s", "--data-dir", filepath.Join(dir, "storm"), "--log-level", "warn")
	if out, err := storm.CombinedOutput(); err != nil {
		t.Fatalf("storm fleet: %v\n%s", err, out)
	}
	after := exec.Command(bin, "loadtest", "fleet", "--agents", "2", "--region", addr, "--node-prefix", "af",
		"--duration", "40s", "--data-dir", filepath.Join(dir, "after"), "--log-level", "warn")
	if err := after.Start(); err != nil {
		t.Fatal(err)
	}
	defer after.Process.Kill()
	afterJob := filepath.Join(dir, "after.yaml")
	if err := os.WriteFile(afterJob, []byte("name: after-storm\ntasks:\n  - name: a\n    count: 4\n    command: \"true\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "job", "run", afterJob, "--wait", "--wait-timeout", "25s", "--addr", addr).CombinedOutput(); err != nil {
		t.Fatalf("a job after the storm: %v\n%s", err, out)
	}
}
