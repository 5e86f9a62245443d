package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/internal/testutil"
)

var updateGolden = flag.Bool("update", false, "rewrite golden files")

// TestTraceGolden renders a recorded span file (spans out of order, another
// job's span, a torn last line) and compares it with the golden timeline.
func TestTraceGolden(t *testing.T) {
	spans, err := telemetry.ReadSpanFile(filepath.Join("testdata", "trace", "spans.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		golden string
		color  bool
	}{{"timeline.golden", false}, {"timeline-color.golden", true}} {
		var buf bytes.Buffer
		n, err := renderTrace(&buf, spans, "eu-west-0c2f9a1b7d3e5f6a8b9c", tc.color)
		if err != nil {
			t.Fatal(err)
		}
		if n != 12 {
			t.Errorf("%d spans drawn, want 12", n)
		}
		path := filepath.Join("testdata", "trace", tc.golden)
		if *updateGolden {
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if buf.String() != string(want) {
			t.Errorf("%s differs (go test -run TestTraceGolden -update to accept):\n%s", tc.golden, buf.String())
		}
		if tc.color != strings.Contains(buf.String(), ansiRed) {
			t.Errorf("color %v but red present %v", tc.color, !tc.color)
		}
	}
	if n, _ := renderTrace(&bytes.Buffer{}, spans, "eu-west-unknown", false); n != 0 {
		t.Errorf("unknown job drew %d spans", n)
	}
}

// TestTraceOverAPIHandRun follows the README's "Run each role by hand": a
// 3-member region with two agents and a global router, started with no
// span file and no OTEL_* variable, and APIARY_ADDR pointing at the router.
// Right after `job run examples/retry.yaml --wait` returns, `apiary trace
// JOB_ID` (through the router, and through each coordinator) must draw the
// job's whole trace from the processes' span buffers, including both
// attempts' task.run spans, which the agent ships about a second after each
// attempt ends.
func TestTraceOverAPIHandRun(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(sovereignty.DefaultYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	agents := []devcluster.AgentSpec{
		{ID: "eu-n1", CPUMillis: 2000, MemoryMiB: 2048, Labels: map[string]string{"arch": "amd64", "disk": "ssd"}},
		{ID: "eu-n2", CPUMillis: 2000, MemoryMiB: 2048, Labels: map[string]string{"arch": "amd64", "disk": "nvme"}},
	}
	bin := testutil.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cl, err := devcluster.Start(ctx, devcluster.Options{Binary: bin, Dir: dir, Global: &devcluster.GlobalSpec{PolicyFile: pol},
		Regions: []devcluster.RegionSpec{{Name: "eu-west", Jurisdiction: "eu", Coordinators: 3, Agents: agents,
			Labels: map[string]string{"tier": "standard"}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl.Stop()
		if t.Failed() {
			for _, p := range append(append([]*devcluster.Proc{cl.Global}, cl.Regions[0].Coords...), cl.Regions[0].Agents...) {
				if b, err := os.ReadFile(p.LogPath); err == nil {
					t.Logf("--- %s\n%s", p.Name, b)
				}
			}
		}
	})
	// As in the README: the router in APIARY_ADDR, no span file anywhere.
	env := []string{telemetry.EnvTraceFile + "=", "APIARY_ADDR=" + cl.GlobalAddr}
	run := runCLI(t, env, "job", "run", filepath.Join("..", "..", "examples", "retry.yaml"), "--wait", "-o", "json")
	if run.code != 0 {
		t.Fatalf("job run: exit %d\n%s%s", run.code, run.stdout, run.stderr)
	}
	var job apiaryv1.Job
	if err := protojson.Unmarshal([]byte(run.stdout), &job); err != nil {
		t.Fatalf("job run output: %v\n%s", err, run.stdout)
	}
	id := job.GetId()

	check := func(via string, args []string, want ...string) {
		t.Helper()
		r := runCLI(t, env, append([]string{"trace", id, "--color", "never"}, args...)...)
		if r.code != 0 {
			t.Fatalf("trace via %s: exit %d\nstdout:\n%s\nstderr:\n%s", via, r.code, r.stdout, r.stderr)
		}
		t.Logf("trace via %s:\n%s%s", via, r.stdout, r.stderr)
		steps := map[string]int{}
		for _, line := range strings.Split(r.stdout, "\n") {
			if f := strings.Fields(line); len(f) >= 3 && strings.HasPrefix(f[0], "+") {
				steps[f[2]]++
			}
		}
		if steps[telemetry.SpanRun] != 2 || steps[telemetry.SpanPlace] < 2 || steps[telemetry.SpanDispatch] != 2 ||
			steps[telemetry.SpanAccept] != 1 || steps[telemetry.SpanRetry] != 1 || steps[telemetry.SpanComplete] != 1 {
			t.Errorf("trace via %s right after the job ended: steps %v, want 2 task.run (one per attempt), 2 task.dispatch, "+
				"task.place, job.accept, task.retry and task.complete\nstdout:\n%s\nstderr:\n%s", via, steps, r.stdout, r.stderr)
		}
		for _, w := range want {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("trace via %s: no %q in\n%s", via, w, r.stdout)
			}
		}
		if strings.Contains(r.stderr, "no task.run span has arrived") {
			t.Errorf("trace via %s: %s", via, r.stderr)
		}
	}
	check("the router ($APIARY_ADDR)", nil, telemetry.SpanRoute, "exit=75", "replaces run of attempt 1")
	// Any coordinator: it asks its peers, one of which holds each agent's spans.
	for _, a := range cl.Regions[0].APIAddrs {
		check("coordinator "+a, []string{"--addr", a}, "exit=0")
	}

	// A job nobody knows: exit 2, not found.
	r := runCLI(t, env, "trace", "eu-west-00000000000000000000")
	if r.code != 2 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("trace of an unknown job: exit %d, stderr %q; want 2 and not found", r.code, r.stderr)
	}
	// A span file nobody wrote: exit 2, saying how to write it or use the API.
	r = runCLI(t, env, "trace", id, "--file", filepath.Join(dir, "none.jsonl"))
	if r.code != 2 || !strings.Contains(r.stderr, "--trace-file") || !strings.Contains(r.stderr, "--addr") {
		t.Errorf("trace --file of a missing file: exit %d, stderr %q; want 2, naming --trace-file and --addr", r.code, r.stderr)
	}
}
