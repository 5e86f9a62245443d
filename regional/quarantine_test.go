package regional_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// TestOperatorQuarantine runs real agents: an operator quarantines n1 with
// the CLI while an attempt runs on it; new work goes to n2 only, the running
// attempt completes on n1, bad requests are refused with nothing written, the
// quarantine survives a coordinator SIGKILL and restart and the agent
// registering again, and after the release n1 gets work again.
func TestOperatorQuarantine(t *testing.T) {
	metricsAddr := testutil.FreeAddr(t)
	_, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{
		{ID: "n1", CPUMillis: 1000, Labels: map[string]string{"zone": "a"}},
		{ID: "n2", CPUMillis: 1000, Labels: map[string]string{"zone": "b"}},
	}, ExtraArgs: []string{"--metrics-addr", metricsAddr}})
	c := dial(t, r)
	if err := r.WaitNodes(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	addr := r.Addr()
	gate := filepath.Join(t.TempDir(), "go")

	// A long attempt on n1, held until the gate file exists.
	long := submit(t, c, spec(t, fmt.Sprintf(`
name: long
tasks:
  - name: hold
    command: sh
    args: ["-c", "until [ -e %s ]; do sleep 0.05; done"]
    resources: {cpu_millis: 250}
    constraints:
      - {label: zone, op: "=", values: [a]}
`, gate)))
	waitState(t, c, long, apiaryv1.JobState_JOB_STATE_RUNNING, 30*time.Second)

	res := runApiary(t, "node", "quarantine", "n1", "--reason", "disk errors on /dev/sdb", "--addr", addr)
	if res.code != 0 || !strings.Contains(res.stdout, "node n1 quarantined since") {
		t.Fatalf("node quarantine: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	n1 := node(t, c, "n1")
	since := n1.GetQuarantinedTimeMs()
	if !n1.GetQuarantined() || n1.GetQuarantineReason() != "disk errors on /dev/sdb" || since == 0 || n1.GetQuarantinedBy() == "" {
		t.Fatalf("n1 after quarantine: %v", n1)
	}
	res = runApiary(t, "node", "list", "--addr", addr)
	if res.code != 0 || !regexp.MustCompile(`(?m)^\S+\s+n1\s+READY.*QUARANTINED since .*ago\): disk errors on /dev/sdb`).MatchString(res.stdout) {
		t.Fatalf("node list does not show n1 quarantined with reason and since when: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}

	t.Run("BadInputWritesNothing", func(t *testing.T) {
		res := runApiary(t, "node", "quarantine", "nope", "--reason", "x", "--addr", addr)
		if res.code != 2 || !strings.Contains(res.stderr, "node nope: no such node") {
			t.Fatalf("unknown node: exit %d\n%s%s", res.code, res.stdout, res.stderr)
		}
		res = runApiary(t, "node", "quarantine", "n2", "--addr", addr)
		if res.code != 2 || !strings.Contains(res.stderr, "--reason: is required") {
			t.Fatalf("no --reason: exit %d\n%s%s", res.code, res.stdout, res.stderr)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, tc := range []struct {
			req   *apiaryv1.QuarantineNodeRequest
			code  codes.Code
			field string
		}{
			{&apiaryv1.QuarantineNodeRequest{NodeId: "n2", Reason: " "}, codes.InvalidArgument, "reason: is required"},
			{&apiaryv1.QuarantineNodeRequest{NodeId: "n2", Reason: strings.Repeat("r", 257)}, codes.InvalidArgument, "reason: at most 256 bytes"},
			{&apiaryv1.QuarantineNodeRequest{NodeId: "n2", Reason: "two\nlines"}, codes.InvalidArgument, "reason: must be valid UTF-8"},
			{&apiaryv1.QuarantineNodeRequest{NodeId: "n1", Reason: "x", By: strings.Repeat("b", 129)}, codes.InvalidArgument, "by: at most 128 bytes"},
			{&apiaryv1.QuarantineNodeRequest{NodeId: "bad id", Reason: "x"}, codes.InvalidArgument, "node_id: must match"},
			{&apiaryv1.QuarantineNodeRequest{NodeId: "n3", Reason: "x"}, codes.NotFound, "node n3"},
		} {
			_, err := c.admin.QuarantineNode(ctx, tc.req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Errorf("QuarantineNode(%q, reason %.20q): %v, want %s naming %q", tc.req.GetNodeId(), tc.req.GetReason(), err, tc.code, tc.field)
			}
		}
		if _, err := c.admin.ReleaseNode(ctx, &apiaryv1.ReleaseNodeRequest{NodeId: "n3"}); status.Code(err) != codes.NotFound {
			t.Errorf("ReleaseNode(n3): %v, want NOT_FOUND", err)
		}
		resp, err := c.admin.ListNodes(ctx, &apiaryv1.ListNodesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetNodes()) != 2 {
			t.Fatalf("nodes after refused requests: %v", resp.GetNodes())
		}
		for _, n := range resp.GetNodes() {
			switch {
			case n.GetId() == "n2" && n.GetQuarantined():
				t.Errorf("n2 was quarantined by a refused request: %v", n)
			case n.GetId() == "n1" && (n.GetQuarantineReason() != "disk errors on /dev/sdb" || n.GetQuarantinedTimeMs() != since):
				t.Errorf("n1's quarantine was changed by a refused request: %v", n)
			}
		}
	})

	// onlyOn runs a 6-task job and checks that every attempt ran on want.
	onlyOn := func(name, want string) {
		t.Helper()
		id := submit(t, c, spec(t, `
name: `+name+`
tasks:
  - name: a
    count: 6
    command: sh
    args: ["-c", "sleep 0.1"]
    resources: {cpu_millis: 250}
`))
		waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
		for _, tk := range logs(t, c, id) {
			for _, a := range tk.GetAttempts() {
				if a.GetNodeId() != want {
					t.Fatalf("%s: task %d attempt %d ran on %s, want only %s", name, tk.GetIndex(), a.GetAttempt(), a.GetNodeId(), want)
				}
			}
		}
	}
	onlyOn("while-quarantined", "n2")
	waitMetric(t, metricsAddr, "apiary_nodes_quarantined", 1)

	// The attempt that was running on n1 continues and completes.
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, long, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	if at := logs(t, c, long)[0].GetAttempts(); len(at) != 1 || at[0].GetNodeId() != "n1" || at[0].GetOutcome() != "complete" {
		t.Fatalf("the attempt running on n1 when it was quarantined: %v", at)
	}

	// A coordinator crash and restart, then the agent registering again.
	if err := r.Coords[0].Kill(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := r.RestartCoordinator(ctx, 0); err != nil {
		t.Fatal(err)
	}
	epoch := waitReady(t, c, "n1", 0).GetEpoch()
	if err := r.Agents[0].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Agents[0].Start(); err != nil {
		t.Fatal(err)
	}
	n1 = waitReady(t, c, "n1", epoch)
	if !n1.GetQuarantined() || n1.GetQuarantineReason() != "disk errors on /dev/sdb" || n1.GetQuarantinedTimeMs() != since {
		t.Fatalf("n1 after a coordinator restart and a new registration (epoch %d -> %d): %v", epoch, n1.GetEpoch(), n1)
	}
	if err := r.WaitNodes(ctx, 2); err != nil {
		t.Fatal(err)
	}
	onlyOn("after-restarts", "n2")

	res = runApiary(t, "node", "release", "n1", "--addr", addr)
	if res.code != 0 || !strings.Contains(res.stdout, "node n1 released") {
		t.Fatalf("node release: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if n := node(t, c, "n1"); n.GetQuarantined() || n.GetQuarantineReason() != "" || n.GetQuarantinedTimeMs() != 0 {
		t.Fatalf("n1 after release: %v", n)
	}
	res = runApiary(t, "node", "release", "n1", "--addr", addr)
	if res.code != 0 || !strings.Contains(res.stdout, "was not quarantined") {
		t.Fatalf("second release: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// n1 gets work again: a job only n1 can run completes there.
	back := submit(t, c, spec(t, `
name: back
tasks:
  - name: a
    command: "true"
    constraints:
      - {label: zone, op: "=", values: [a]}
`))
	waitState(t, c, back, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	waitMetric(t, metricsAddr, "apiary_nodes_quarantined", 0)

	// The events are in the coordinator's log.
	b, err := os.ReadFile(r.Coords[0].LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []string{"node quarantined", "node released from quarantine"} {
		if !strings.Contains(string(b), ev) {
			t.Errorf("coordinator log has no %q event", ev)
		}
	}
}

// node returns the region's view of one node (waiting until it is listed).
func node(t *testing.T, c clients, id string) *apiaryv1.Node {
	t.Helper()
	var out *apiaryv1.Node
	testutil.Eventually(t, 10*time.Second, "list nodes", func() error {
		nodes, err := listNodesOnce(c)
		if err != nil {
			return err
		}
		if out = nodes[id]; out == nil {
			return fmt.Errorf("no node %s", id)
		}
		return nil
	})
	return out
}

// listNodesOnce is one ListNodes call: the region's nodes by id.
func listNodesOnce(c clients) (map[string]*apiaryv1.Node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := c.admin.ListNodes(ctx, &apiaryv1.ListNodesRequest{})
	if err != nil {
		return nil, err
	}
	out := map[string]*apiaryv1.Node{}
	for _, n := range resp.GetNodes() {
		out[n.GetId()] = n
	}
	return out, nil
}

// waitReady waits until the node is READY at an epoch above after.
func waitReady(t *testing.T, c clients, id string, after int64) *apiaryv1.Node {
	t.Helper()
	var out *apiaryv1.Node
	testutil.Eventually(t, 30*time.Second, id+" ready", func() error {
		out = node(t, c, id)
		if out.GetStatus() != apiaryv1.NodeStatus_NODE_STATUS_READY || out.GetEpoch() <= after {
			return fmt.Errorf("%s %s epoch %d", id, out.GetStatus(), out.GetEpoch())
		}
		return nil
	})
	return out
}

// waitMetric waits until the coordinator's metrics at addr show the
// (unlabelled or constant-labelled) gauge at want.
func waitMetric(t *testing.T, addr, name string, want float64) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + name + `(\{[^}]*\})? (\S+)$`)
	testutil.Eventually(t, 15*time.Second, name, func() error {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		m := re.FindSubmatch(b)
		if m == nil {
			return fmt.Errorf("no %s in the metrics", name)
		}
		if got := string(m[2]); got != fmt.Sprint(want) {
			return fmt.Errorf("%s = %s, want %v", name, got, want)
		}
		return nil
	})
}
