package regional_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// Issue 11: one bad host must never fail a job. The bad hosts here are made
// the way they break in production: a directory first in one agent's PATH
// holds a `sleep` that exits at once (a corrupt binary cache), or the
// agent's work dir is broken (devcluster.BreakWorkDir); the jobs' command
// stays `sleep 1` everywhere.

// badSleep returns the environment of an agent whose PATH finds, first, a
// `sleep` that exits with code, and the path of that script (remove it to
// repair the host).
func badSleep(t *testing.T, code int) (env []string, script string) {
	t.Helper()
	dir := t.TempDir()
	script = filepath.Join(dir, "sleep")
	if err := os.WriteFile(script, []byte(fmt.Sprintf("#!/bin/sh\necho 'sleep: corrupt binary cache' >&2\nexit %d\n", code)), 0o755); err != nil {
		t.Fatal(err)
	}
	return []string{"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH")}, script
}

// sleepers is a job of n tasks of `sleep 1` (100m each); extra is more
// task-group YAML (e.g. retryable_exit_codes).
func sleepers(t *testing.T, name string, n int, extra string) *apiaryv1.JobSpec {
	t.Helper()
	return spec(t, fmt.Sprintf(`
name: %s
tasks:
  - name: s
    count: %d
    command: sleep
    args: ["1"]
%s`, name, n, extra))
}

// filler is a job of one 1000m task per zone-b node, held until gate
// exists: it takes every slot of those nodes, so that the next task that
// fits anywhere else can only go to the zone-a node.
func filler(t *testing.T, gate string, n int) *apiaryv1.JobSpec {
	t.Helper()
	return spec(t, fmt.Sprintf(`
name: filler
tasks:
  - name: hold
    count: %d
    command: sh
    args: ["-c", "until [ -e %s ]; do sleep 0.05; done"]
    resources: {cpu_millis: 1000}
    constraints:
      - {label: zone, op: "=", values: [b]}
`, n, gate))
}

// ended drops the attempts that did not end by running: refused by the
// agent or lost with their node epoch (liveness, which the attribution
// does not count).
func ended(at []*apiaryv1.AttemptResult) []*apiaryv1.AttemptResult {
	var out []*apiaryv1.AttemptResult
	for _, a := range at {
		if a.GetOutcome() != "refused" && a.GetOutcome() != "lost" {
			out = append(out, a)
		}
	}
	return out
}

// zoneBQuarantine is a region of n1 (zone a, whose `sleep` exits 1) and
// n2, n3 (zone b), with region flags args, where n1 was just quarantined
// automatically: zone b is held full by a filler job (open its gate with
// openGate(t, gateDir)), then two jobs of 2 tasks each, which only n1 can
// take, fail there; the third failure (of two jobs) quarantines it and the
// jobs' tasks wait for zone b.
type zoneBQuarantine struct {
	r       *devcluster.Region
	c       clients
	script  string // n1's bad `sleep`: remove it to repair n1
	gateDir string
	fill    string   // the filler job
	jobs    []string // the two jobs that failed on n1
	q       *apiaryv1.Node
}

func quarantineBehindFullZone(t *testing.T, args ...string) zoneBQuarantine {
	t.Helper()
	env, script := badSleep(t, 1)
	_, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{
		{ID: "n1", CPUMillis: 1000, Env: env, Labels: map[string]string{"zone": "a"}},
		{ID: "n2", CPUMillis: 1000, Labels: map[string]string{"zone": "b"}},
		{ID: "n3", CPUMillis: 1000, Labels: map[string]string{"zone": "b"}},
	}, ExtraArgs: args})
	c := dial(t, r)
	if err := r.WaitNodes(t.Context(), 3); err != nil {
		t.Fatal(err)
	}
	z := zoneBQuarantine{r: r, c: c, script: script, gateDir: t.TempDir()}
	z.fill = submit(t, c, filler(t, filepath.Join(z.gateDir, "go"), 2))
	waitRunning(t, c, z.fill, 2)
	z.jobs = []string{submit(t, c, sleepers(t, "a", 2, "")), submit(t, c, sleepers(t, "b", 2, ""))}
	z.q = waitAutoQuarantined(t, c, "n1", 30*time.Second)
	checkAutoQuarantine(t, z.q)
	if z.q.GetQuarantineStrikes() != 1 {
		t.Fatalf("n1: strike %d, want 1", z.q.GetQuarantineStrikes())
	}
	return z
}

// listNodes returns the region's nodes by id.
func listNodes(t *testing.T, c clients) map[string]*apiaryv1.Node {
	t.Helper()
	var out map[string]*apiaryv1.Node
	testutil.Eventually(t, 10*time.Second, "list nodes", func() (err error) {
		out, err = listNodesOnce(c)
		return err
	})
	return out
}

// autoQuarantined returns the ids of the nodes quarantined automatically.
func autoQuarantined(nodes map[string]*apiaryv1.Node) []string {
	var ids []string
	for id, n := range nodes {
		if n.GetQuarantineAutomatic() {
			ids = append(ids, id)
		}
	}
	return ids
}

// waitAutoQuarantined waits until node id is quarantined automatically
// and returns it.
func waitAutoQuarantined(t *testing.T, c clients, id string, timeout time.Duration) *apiaryv1.Node {
	t.Helper()
	var n *apiaryv1.Node
	testutil.Eventually(t, timeout, id+" quarantined automatically", func() error {
		n = node(t, c, id)
		if !n.GetQuarantineAutomatic() {
			return fmt.Errorf("%s: quarantined %v, failed %d of %d recent attempts", id, n.GetQuarantined(), n.GetRecentFailures(), n.GetRecentAttempts())
		}
		return nil
	})
	return n
}

// checkAutoQuarantine asserts the shape of an automatic quarantine: the
// quarantine fields are set, by "apiary (automatic)", and the reason is
// the rule's, naming failures and jobs.
func checkAutoQuarantine(t *testing.T, n *apiaryv1.Node) {
	t.Helper()
	if !n.GetQuarantined() || !n.GetQuarantineAutomatic() || n.GetQuarantinedBy() != "apiary (automatic)" ||
		n.GetQuarantinedTimeMs() == 0 || n.GetQuarantineProbeTimeMs() <= n.GetQuarantinedTimeMs() || n.GetQuarantineStrikes() < 1 {
		t.Fatalf("%s: not an automatic quarantine: %v", n.GetId(), n)
	}
	if !regexp.MustCompile(`^\d+ failures of [2-9]\d* jobs in `).MatchString(n.GetQuarantineReason()) {
		t.Fatalf("%s: quarantine reason %q does not name its failures and (at least 2) jobs", n.GetId(), n.GetQuarantineReason())
	}
}

// metric returns the value of one series (name and labels, as exposed) of
// the coordinator's metrics at addr; 0 when it is absent.
func metric(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func quarantineEvents(t *testing.T, addr, event string) float64 {
	return metric(t, addr, `apiary_node_quarantine_events_total{event="`+event+`"}`)
}

// coordLog returns the region's first coordinator's log.
func coordLog(t *testing.T, r *devcluster.Region) string {
	t.Helper()
	b, err := os.ReadFile(r.Coords[0].LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// nodeListLine returns `apiary node list`'s line of node id.
func nodeListLine(t *testing.T, r *devcluster.Region, id string) string {
	t.Helper()
	res := runApiary(t, "node", "list", "--addr", r.Addr())
	if res.code != 0 {
		t.Fatalf("node list: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	m := regexp.MustCompile(`(?m)^\S+\s+` + regexp.QuoteMeta(id) + `\s.*$`).FindString(res.stdout)
	if m == "" {
		t.Fatalf("node list has no line for %s:\n%s", id, res.stdout)
	}
	return m
}

// jobLogsCLI returns `apiary job logs id`'s output.
func jobLogsCLI(t *testing.T, r *devcluster.Region, id string) string {
	t.Helper()
	res := runApiary(t, "job", "logs", id, "--addr", r.Addr())
	if res.code != 0 {
		t.Fatalf("job logs %s: exit %d\n%s%s", id, res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

// TestBadNodeTable is the table: 4 agents x 1000m, 3 jobs x 20
// tasks of `sleep 1` submitted at once, one agent (n1) healthy (the
// control) or bad in one of three ways. With a bad agent no task and no
// job fails, n1 is quarantined automatically after a bounded number of
// attempts, the healthy nodes are not, and the CLI shows why; in the
// control nothing is quarantined. Each setup runs on a fresh region (fresh
// windows).
func TestBadNodeTable(t *testing.T) {
	const slots = 10 // 1000m / 100m: attempts n1 can run at once
	for _, tc := range []struct {
		name       string
		exit       int    // the bad `sleep`'s exit code (0: none)
		workDir    bool   // break n1's work dir
		retryable  string // task-group YAML
		wantFaults []apiaryv1.FailureFault
	}{
		{name: "HealthyControl"},
		// Before the quarantine an exit 75 is retryable and charged (JOB);
		// once n1 is blamed it is the node's.
		{name: "Exit75", exit: 75, retryable: "    retryable_exit_codes: [75]\n",
			wantFaults: []apiaryv1.FailureFault{apiaryv1.FailureFault_FAILURE_FAULT_JOB, apiaryv1.FailureFault_FAILURE_FAULT_NODE}},
		// An exit 1 on a node no success vouches for is unconfirmed
		// (retried once elsewhere) until n1 is blamed.
		{name: "Exit1", exit: 1,
			wantFaults: []apiaryv1.FailureFault{apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED, apiaryv1.FailureFault_FAILURE_FAULT_NODE}},
		// The agent classifies a start failure on its own paths as the
		// node's.
		{name: "BrokenWorkDir", workDir: true,
			wantFaults: []apiaryv1.FailureFault{apiaryv1.FailureFault_FAILURE_FAULT_NODE}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			metricsAddr := testutil.FreeAddr(t)
			agents := []devcluster.AgentSpec{{ID: "n1", CPUMillis: 1000}, {ID: "n2", CPUMillis: 1000},
				{ID: "n3", CPUMillis: 1000}, {ID: "n4", CPUMillis: 1000}}
			if tc.exit != 0 {
				agents[0].Env, _ = badSleep(t, tc.exit)
			}
			cl, r := cluster(t, devcluster.RegionSpec{Agents: agents, ExtraArgs: []string{"--metrics-addr", metricsAddr}})
			c := dial(t, r)
			if err := r.WaitNodes(t.Context(), 4); err != nil {
				t.Fatal(err)
			}
			if tc.workDir {
				if err := cl.BreakWorkDir("n1"); err != nil {
					t.Fatal(err)
				}
			}
			bad := tc.exit != 0 || tc.workDir

			start := time.Now()
			var ids []string
			for i := range 3 {
				ids = append(ids, submit(t, c, sleepers(t, fmt.Sprintf("sleepers-%d", i), 20, tc.retryable)))
			}
			for _, id := range ids {
				j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 90*time.Second)
				if j.GetCounts().GetComplete() != 20 || j.GetCounts().GetFailed() != 0 {
					t.Fatalf("job %s: counts %v, want 20 complete, 0 failed", id, j.GetCounts())
				}
			}
			wall := time.Since(start)

			// Every attempt: where it ran, how it ended, whose fault.
			onBad, placedBad, faults := 0, 0, map[apiaryv1.FailureFault]int{}
			noteJob := map[apiaryv1.FailureFault]string{} // a job whose logs show the fault
			for _, id := range ids {
				for _, tk := range logs(t, c, id) {
					for _, a := range tk.GetAttempts() {
						if a.GetNodeId() == "n1" {
							placedBad++
						}
						switch a.GetOutcome() {
						case "complete":
							if bad && a.GetNodeId() == "n1" {
								t.Fatalf("job %s task %d completed on the bad node n1: %v", id, tk.GetIndex(), a)
							}
							continue
						case "refused", "lost":
							// The agent's refusal of an assignment and a
							// lost node epoch are liveness, not outcomes
							// the attribution counts (it does not here
							// either: the healthy nodes' windows are
							// checked to hold no failure).
							t.Logf("job %s task %d attempt %d on %s: %s (%s)", id, tk.GetIndex(), a.GetAttempt(), a.GetNodeId(), a.GetOutcome(), a.GetError())
							continue
						}
						if !bad || a.GetNodeId() != "n1" || a.GetOutcome() != "retry" {
							t.Fatalf("job %s task %d attempt %d on %s: %s (fault %s, error %q); want only retries of attempts on the bad node",
								id, tk.GetIndex(), a.GetAttempt(), a.GetNodeId(), a.GetOutcome(), a.GetFault(), a.GetError())
						}
						onBad++
						faults[a.GetFault()]++
						noteJob[a.GetFault()] = id
					}
				}
			}
			nodes := listNodes(t, c)
			t.Logf("%s: 60 tasks complete in %s; %d attempts ended on n1, faults %v", tc.name, wall.Round(10*time.Millisecond), onBad, faults)

			if !bad {
				if q := autoQuarantined(nodes); len(q) > 0 {
					t.Fatalf("control: nodes %v quarantined", q)
				}
				for id, n := range nodes {
					if n.GetQuarantined() || n.GetRecentFailures() != 0 || n.GetRecentAttempts() == 0 {
						t.Fatalf("control: %s quarantined %v, failed %d of %d recent attempts", id, n.GetQuarantined(), n.GetRecentFailures(), n.GetRecentAttempts())
					}
				}
				if v := quarantineEvents(t, metricsAddr, "quarantined"); v != 0 {
					t.Fatalf("control: %v quarantine events", v)
				}
				return
			}

			n1 := nodes["n1"]
			checkAutoQuarantine(t, n1)
			if n1.GetQuarantineStrikes() != 1 {
				t.Fatalf("n1: strike %d, want 1 (no canary is due within the test)", n1.GetQuarantineStrikes())
			}
			for _, id := range []string{"n2", "n3", "n4"} {
				if n := nodes[id]; n.GetQuarantined() || n.GetQuarantineStrikes() != 0 || n.GetRecentFailures() != 0 {
					t.Fatalf("healthy %s: quarantined %v (%q), strikes %d, failed %d of %d", id, n.GetQuarantined(), n.GetQuarantineReason(),
						n.GetQuarantineStrikes(), n.GetRecentFailures(), n.GetRecentAttempts())
				}
			}
			t.Logf("quarantined %s after submission: %s", time.UnixMilli(n1.GetQuarantinedTimeMs()).Sub(start).Round(time.Millisecond), n1.GetQuarantineReason())
			// The bound: n1 runs at most its 10 slots at a time. Its
			// first wave may hold one job's tasks only (binpack fills
			// it from one job, and failures of one job never
			// quarantine), so a second wave may be placed in the slots
			// they free before the first failure of another job tips
			// it; after that nothing new is placed there (a plan
			// computed before the quarantine and committed after it is
			// rejected: planWrite compares the quarantine set).
			if onBad == 0 || placedBad > 2*slots {
				t.Fatalf("%d attempts placed on n1 (%d failed there), want 1..%d (two waves of its slots)", placedBad, onBad, 2*slots)
			}
			if int(n1.GetRecentFailures()) != onBad || n1.GetRecentAttempts() != n1.GetRecentFailures() {
				t.Fatalf("n1's window: failed %d of %d, want all %d attempts that ended on it", n1.GetRecentFailures(), n1.GetRecentAttempts(), onBad)
			}
			for f := range faults {
				found := false
				for _, w := range tc.wantFaults {
					found = found || f == w
				}
				if !found {
					t.Fatalf("faults %v on n1, want only %v", faults, tc.wantFaults)
				}
			}
			if faults[apiaryv1.FailureFault_FAILURE_FAULT_NODE] == 0 {
				t.Fatalf("faults %v on n1: none blamed on the node", faults)
			}
			if tc.exit == 1 && faults[apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED] == 0 {
				t.Fatalf("faults %v on n1: its first failure (no record yet) must be unconfirmed", faults)
			}

			// What operators see.
			line := nodeListLine(t, r, "n1")
			re := regexp.MustCompile(fmt.Sprintf(`^\S+\s+n1\s+READY\s.*\s%d/%d\s+QUARANTINED \(automatic, strike 1, canary in \d+s\) since .*: \d+ failures of \d+ jobs in `,
				n1.GetRecentFailures(), n1.GetRecentAttempts()))
			if !re.MatchString(line) {
				t.Fatalf("node list line of n1 does not show its automatic quarantine and FAILED %d/%d:\n%s", n1.GetRecentFailures(), n1.GetRecentAttempts(), line)
			}
			if line := nodeListLine(t, r, "n2"); !regexp.MustCompile(`\s0/\d+\s+eligible\s`).MatchString(line + " ") {
				t.Fatalf("node list line of n2: %s", line)
			}
			out := jobLogsCLI(t, r, noteJob[apiaryv1.FailureFault_FAILURE_FAULT_NODE])
			if !strings.Contains(out, "on n1: retry (node fault, not charged)") {
				t.Fatalf("job logs shows no node fault on n1:\n%s", out)
			}
			if id, ok := noteJob[apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED]; ok {
				if out := jobLogsCLI(t, r, id); !strings.Contains(out, "on n1: retry (unconfirmed: retried on another node to confirm, not charged)") {
					t.Fatalf("job logs shows no unconfirmed failure on n1:\n%s", out)
				}
			}
			if v := quarantineEvents(t, metricsAddr, "quarantined"); v != 1 {
				t.Fatalf("apiary_node_quarantine_events_total{event=\"quarantined\"} = %v, want 1", v)
			}
			// One outlier of 4 nodes: the share guard (1 of 4) never
			// stands in its way.
			if v := quarantineEvents(t, metricsAddr, "refused"); v != 0 {
				t.Fatalf("apiary_node_quarantine_events_total{event=\"refused\"} = %v with one bad node of 4, want 0", v)
			}
			if log := coordLog(t, r); !strings.Contains(log, "node quarantined automatically") || !strings.Contains(log, "node=n1") {
				t.Fatal("the coordinator did not log n1's automatic quarantine")
			}
		})
	}
}

// TestBadNodeMissingCommand: a command missing on every node is the job's
// fault: each task fails once it failed to start on two distinct nodes
// (the first failure is unconfirmed, retried elsewhere without charge).
// All the failures are one job's, so no node is quarantined, though each
// node counts them.
func TestBadNodeMissingCommand(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{
		{ID: "n1", CPUMillis: 1000}, {ID: "n2", CPUMillis: 1000}, {ID: "n3", CPUMillis: 1000}}})
	c := dial(t, r)
	if err := r.WaitNodes(t.Context(), 3); err != nil {
		t.Fatal(err)
	}
	id := submit(t, c, spec(t, `
name: no-such-command
max_attempts: 5
tasks:
  - name: a
    count: 6
    command: /nonexistent/apiary-no-such-command
`))
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_FAILED, 60*time.Second)
	if j.GetCounts().GetFailed() != 6 {
		t.Fatalf("counts %v, want 6 failed", j.GetCounts())
	}
	attempts := 0
	for _, tk := range logs(t, c, id) {
		on := map[string]bool{}
		at := ended(tk.GetAttempts())
		for i, a := range at {
			// The first failure on a node is unconfirmed (retried on
			// another node, not charged); the last is the job's.
			want := apiaryv1.FailureFault_FAILURE_FAULT_JOB
			if i == 0 && len(at) > 1 {
				want = apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED
			}
			if a.GetFault() != want || a.GetOutcome() == "complete" {
				t.Fatalf("task %d attempt %d on %s: %s, fault %s (error %q), want %s", tk.GetIndex(), a.GetAttempt(), a.GetNodeId(), a.GetOutcome(), a.GetFault(), a.GetError(), want)
			}
			on[a.GetNodeId()] = true
			attempts++
		}
		if len(on) != 2 || len(at) > 3 || !strings.Contains(tk.GetError(), "2 distinct nodes") {
			t.Fatalf("task %d failed after %d attempts on %v with error %q; want a job fault on 2 distinct nodes", tk.GetIndex(), len(at), on, tk.GetError())
		}
	}
	counted := 0
	for id, n := range listNodes(t, c) {
		if n.GetQuarantined() || n.GetQuarantineStrikes() != 0 {
			t.Fatalf("%s quarantined (%q) by one job's failures", id, n.GetQuarantineReason())
		}
		counted += int(n.GetRecentFailures())
	}
	if counted != attempts {
		t.Fatalf("the nodes counted %d failures, want the %d failed attempts", counted, attempts)
	}
}

// TestBadNodeBadJob: a job that exits 1 on every node fails terminally
// (each task after at most 2 attempts: unconfirmed once, then final) and
// quarantines nothing, while a healthy job running at the same time
// completes.
func TestBadNodeBadJob(t *testing.T) {
	metricsAddr := testutil.FreeAddr(t)
	_, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{
		{ID: "n1", CPUMillis: 1000}, {ID: "n2", CPUMillis: 1000}, {ID: "n3", CPUMillis: 1000}},
		ExtraArgs: []string{"--metrics-addr", metricsAddr}})
	c := dial(t, r)
	if err := r.WaitNodes(t.Context(), 3); err != nil {
		t.Fatal(err)
	}
	badJob := submit(t, c, spec(t, `
name: bad-job
tasks:
  - name: a
    count: 12
    command: sh
    args: ["-c", "echo broken input >&2; exit 1"]
`))
	good := submit(t, c, sleepers(t, "good", 12, ""))
	j := waitState(t, c, badJob, apiaryv1.JobState_JOB_STATE_FAILED, 60*time.Second)
	if j.GetCounts().GetFailed() != 12 {
		t.Fatalf("bad job: counts %v, want 12 failed", j.GetCounts())
	}
	if j := waitState(t, c, good, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second); j.GetCounts().GetComplete() != 12 {
		t.Fatalf("healthy job: counts %v", j.GetCounts())
	}
	attempts := 0
	for _, tk := range logs(t, c, badJob) {
		at := ended(tk.GetAttempts())
		if len(at) == 0 || len(at) > 2 {
			t.Fatalf("task %d: %d attempts, want 1 or 2: %v", tk.GetIndex(), len(at), at)
		}
		for i, a := range at {
			want := apiaryv1.FailureFault_FAILURE_FAULT_JOB
			if i < len(at)-1 {
				want = apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED
			}
			if a.GetFault() != want || a.GetExitCode() != 1 {
				t.Fatalf("task %d attempt %d on %s: exit %d fault %s (error %q), want %s", tk.GetIndex(), a.GetAttempt(), a.GetNodeId(),
					a.GetExitCode(), a.GetFault(), a.GetError(), want)
			}
			attempts++
		}
		if len(at) == 2 && at[0].GetNodeId() == at[1].GetNodeId() {
			t.Fatalf("task %d: its unconfirmed failure was confirmed on the same node %s", tk.GetIndex(), at[0].GetNodeId())
		}
	}
	counted := 0
	for id, n := range listNodes(t, c) {
		if n.GetQuarantined() || n.GetQuarantineStrikes() != 0 {
			t.Fatalf("%s quarantined (%q) by a bad job", id, n.GetQuarantineReason())
		}
		counted += int(n.GetRecentFailures())
	}
	if counted != attempts {
		t.Fatalf("the nodes counted %d failures, want the bad job's %d attempts", counted, attempts)
	}
	for _, ev := range []string{"quarantined", "refused"} {
		if v := quarantineEvents(t, metricsAddr, ev); v != 0 {
			t.Fatalf("%v %s events: a bad job made a node an outlier", v, ev)
		}
	}
}

// TestBadNodeQuarantineSurvivesCoordinatorKill: n1 is quarantined
// automatically (quarantineBehindFullZone), its jobs complete on zone b,
// the region's only coordinator is SIGKILLed and restarted from its data
// dir; n1 is still quarantined automatically (same since, reason, strike
// and canary time) and a job larger than the healthy nodes' capacity
// places nothing on it.
func TestBadNodeQuarantineSurvivesCoordinatorKill(t *testing.T) {
	z := quarantineBehindFullZone(t, "--quarantine-probe-after", "10m")
	r, c, before := z.r, z.c, z.q
	openGate(t, z.gateDir)
	for _, id := range append([]string{z.fill}, z.jobs...) {
		if j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second); j.GetCounts().GetFailed() != 0 {
			t.Fatalf("job %s: counts %v", id, j.GetCounts())
		}
	}

	if err := r.Coords[0].Kill(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := r.RestartCoordinator(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitNodes(ctx, 3); err != nil {
		t.Fatal(err)
	}
	after := node(t, c, "n1")
	checkAutoQuarantine(t, after)
	if after.GetQuarantinedTimeMs() != before.GetQuarantinedTimeMs() || after.GetQuarantineReason() != before.GetQuarantineReason() ||
		after.GetQuarantineStrikes() != 1 || after.GetQuarantineProbeTimeMs() != before.GetQuarantineProbeTimeMs() {
		t.Fatalf("n1's automatic quarantine changed across the restart:\nbefore %v\nafter  %v", before, after)
	}
	if line := nodeListLine(t, r, "n1"); !strings.Contains(line, "QUARANTINED (automatic, strike 1, canary in ") {
		t.Fatalf("node list after the restart: %s", line)
	}
	// 30 tasks: the healthy nodes hold 20 at a time, so an eligible n1
	// would get some.
	after30 := submit(t, c, sleepers(t, "after-restart", 30, ""))
	if j := waitState(t, c, after30, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second); j.GetCounts().GetComplete() != 30 {
		t.Fatalf("counts %v", j.GetCounts())
	}
	for _, tk := range logs(t, c, after30) {
		for _, at := range tk.GetAttempts() {
			if at.GetNodeId() == "n1" || (at.GetOutcome() != "complete" && len(ended([]*apiaryv1.AttemptResult{at})) > 0) {
				t.Fatalf("task %d attempt %d on %s: %s; want every attempt complete off the quarantined n1", tk.GetIndex(), at.GetAttempt(), at.GetNodeId(), at.GetOutcome())
			}
		}
	}
	if n := node(t, c, "n1"); !n.GetQuarantineAutomatic() || n.GetQuarantineStrikes() != 1 {
		t.Fatalf("n1 at the end: %v", n)
	}
}

// TestBadNodeProbeRelease: n1 (zone a; n2 and n3 are zone b) runs a `sleep`
// that exits 1 and is quarantined; its canary is probed after 2 s. The
// zone-b nodes are kept full (filler) so that the next task that fits
// anywhere can only be n1's canary. While n1 is still bad, one canary runs
// there, fails, and n1 stays quarantined with strike 2 and the next canary
// 4 s later; the canary task itself (max_attempts 1) completes elsewhere,
// uncharged. Once n1 is repaired its next canary succeeds, n1 is released
// (strikes kept, eligible in node list) and later tasks run there again.
func TestBadNodeProbeRelease(t *testing.T) {
	metricsAddr := testutil.FreeAddr(t)
	z := quarantineBehindFullZone(t, "--quarantine-probe-after", "2s", "--metrics-addr", metricsAddr)
	r, c, q1, fill1, a, b := z.r, z.c, z.q, z.fill, z.jobs[0], z.jobs[1]
	if d := q1.GetQuarantineProbeTimeMs() - q1.GetQuarantinedTimeMs(); d != 2000 {
		t.Fatalf("n1's first canary is due %d ms after its quarantine, want 2000 (--quarantine-probe-after)", d)
	}

	// The failed canary: this task fits only n1 (zone b is full) and waits
	// for its canary.
	canary := submit(t, c, spec(t, `
name: canary-fails
max_attempts: 1
tasks:
  - name: s
    command: sleep
    args: ["1"]
`))
	var q2 *apiaryv1.Node
	testutil.Eventually(t, 20*time.Second, "n1's first canary fails", func() error {
		q2 = node(t, c, "n1")
		if q2.GetQuarantineStrikes() < 2 {
			return fmt.Errorf("n1: strike %d, probe in %s", q2.GetQuarantineStrikes(), time.Until(time.UnixMilli(q2.GetQuarantineProbeTimeMs())))
		}
		return nil
	})
	// Free zone b before n1's next canary is due (4 s).
	openGate(t, z.gateDir)
	checkAutoQuarantine(t, q2)
	if q2.GetQuarantineStrikes() != 2 || q2.GetQuarantinedTimeMs() != q1.GetQuarantinedTimeMs() || q2.GetQuarantineProbeTimeMs() <= q1.GetQuarantineProbeTimeMs() {
		t.Fatalf("n1 after a failed canary: %v; want strike 2, the same since and a later canary than %d", q2, q1.GetQuarantineProbeTimeMs())
	}
	for _, id := range []string{fill1, a, b, canary} {
		if j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second); j.GetCounts().GetFailed() != 0 {
			t.Fatalf("job %s: counts %v", id, j.GetCounts())
		}
	}
	at := logs(t, c, canary)[0].GetAttempts()
	if len(at) != 2 || at[0].GetNodeId() != "n1" || at[0].GetOutcome() != "retry" || at[0].GetFault() != apiaryv1.FailureFault_FAILURE_FAULT_NODE ||
		at[1].GetNodeId() == "n1" || at[1].GetOutcome() != "complete" {
		t.Fatalf("canary task's attempts: %v; want a node-fault retry on n1, then a completion elsewhere (max_attempts 1: uncharged)", at)
	}
	if at[0].GetStartTimeMs() < q1.GetQuarantineProbeTimeMs() {
		t.Fatalf("the canary started at %d, before n1's canary was due (%d)", at[0].GetStartTimeMs(), q1.GetQuarantineProbeTimeMs())
	}
	// The backoff doubled: the next canary is due 4 s after the failed one
	// was committed (at or after the attempt's end).
	if d := q2.GetQuarantineProbeTimeMs() - at[0].GetEndTimeMs(); d < 4000 || d > 6000 {
		t.Fatalf("n1's next canary is due %d ms after the failed one ended, want 4 s (2 s doubled)", d)
	}
	t.Logf("the failed canary started %d ms after it was due; the next was due %d ms after it ended",
		at[0].GetStartTimeMs()-q1.GetQuarantineProbeTimeMs(), q2.GetQuarantineProbeTimeMs()-at[0].GetEndTimeMs())
	if out := jobLogsCLI(t, r, canary); !strings.Contains(out, "attempt 1 on n1: retry (node fault, not charged)") {
		t.Fatalf("job logs of the canary task:\n%s", out)
	}
	// No attempt of a or b ran on n1 again after it failed there.
	for _, id := range []string{a, b} {
		for _, tk := range logs(t, c, id) {
			on1 := 0
			for _, x := range tk.GetAttempts() {
				if x.GetNodeId() == "n1" {
					on1++
				}
			}
			if on1 != 1 {
				t.Fatalf("job %s task %d: %d attempts on n1, want 1: %v", id, tk.GetIndex(), on1, tk.GetAttempts())
			}
		}
	}

	// Repair n1; with zone b full again the next task that fits is n1's
	// canary, which now succeeds.
	if err := os.Remove(z.script); err != nil {
		t.Fatal(err)
	}
	gate2 := filepath.Join(t.TempDir(), "go")
	fill2 := submit(t, c, filler(t, gate2, 2))
	waitRunning(t, c, fill2, 2)
	probe := submit(t, c, sleepers(t, "canary-succeeds", 1, ""))
	if j := waitState(t, c, probe, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second); j.GetTasks()[0].GetNodeId() != "n1" {
		t.Fatalf("the second canary ran on %s, want n1", j.GetTasks()[0].GetNodeId())
	}
	var rel *apiaryv1.Node
	testutil.Eventually(t, 10*time.Second, "n1 released", func() error {
		if rel = node(t, c, "n1"); rel.GetQuarantined() {
			return fmt.Errorf("n1 still quarantined: %v", rel)
		}
		return nil
	})
	if rel.GetQuarantineAutomatic() || rel.GetQuarantineReason() != "" || rel.GetQuarantineStrikes() != 2 {
		t.Fatalf("n1 after its canary succeeded: %v; want released with its 2 strikes kept", rel)
	}
	if line := nodeListLine(t, r, "n1"); !regexp.MustCompile(`\seligible\s`).MatchString(line + " ") {
		t.Fatalf("node list does not show n1 eligible after the release: %s", line)
	}
	// Later tasks go to n1 again (zone b is still full).
	later := submit(t, c, sleepers(t, "later", 3, ""))
	waitState(t, c, later, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	for _, tk := range logs(t, c, later) {
		if x := tk.GetAttempts(); len(x) != 1 || x[0].GetNodeId() != "n1" || x[0].GetOutcome() != "complete" {
			t.Fatalf("later task %d: %v; want one attempt, complete on n1", tk.GetIndex(), x)
		}
	}
	openGate(t, filepath.Dir(gate2))
	waitState(t, c, fill2, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)

	for ev, want := range map[string]float64{"quarantined": 1, "requarantined": 1, "released": 1} {
		if v := quarantineEvents(t, metricsAddr, ev); v != want {
			t.Errorf("apiary_node_quarantine_events_total{event=%q} = %v, want %v", ev, v, want)
		}
	}
	log := coordLog(t, r)
	for _, ev := range []string{"node stays quarantined: its canary failed", "node released from automatic quarantine: its canary succeeded"} {
		if !strings.Contains(log, ev) {
			t.Errorf("coordinator log has no %q", ev)
		}
	}
}

// TestBadNodeShareGuard: 4 agents, two of them bad (a `sleep` that exits
// 75, retryable), --quarantine-max-share 0.25: at most one node is
// quarantined automatically at any time, the other bad node is an outlier
// the guard refuses (its failures retried elsewhere), and the jobs
// complete. An operator's `apiary node release` ends the automatic
// quarantine.
func TestBadNodeShareGuard(t *testing.T) {
	metricsAddr := testutil.FreeAddr(t)
	env1, _ := badSleep(t, 75)
	env2, _ := badSleep(t, 75)
	_, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{
		{ID: "n1", CPUMillis: 1000, Env: env1}, {ID: "n2", CPUMillis: 1000, Env: env2},
		{ID: "n3", CPUMillis: 1000}, {ID: "n4", CPUMillis: 1000}},
		ExtraArgs: []string{"--quarantine-max-share", "0.25", "--metrics-addr", metricsAddr}})
	c := dial(t, r)
	if err := r.WaitNodes(t.Context(), 4); err != nil {
		t.Fatal(err)
	}
	// A history first: every node runs `true` (which the bad hosts can
	// run), so the healthy nodes' successes fill the region's window.
	// Without one, the first bad node's failures are most of the rest of
	// the region that the second is compared with, and the relative rule
	// alone may keep the second from being an outlier (the guard would not
	// be what kept it in service). Spread, so that every node gets about a
	// quarter (under binpack the split follows which node frees a slot
	// first: n4 once ran 16 of 120).
	warm := submit(t, c, spec(t, `
name: history
scheduler: spread
tasks:
  - name: t
    count: 120
    command: "true"
`))
	waitState(t, c, warm, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
	for _, id := range []string{"n3", "n4"} {
		if n := node(t, c, id); n.GetRecentAttempts() < 20 {
			t.Fatalf("%s ran %d attempts of the history job, want at least 20", id, n.GetRecentAttempts())
		}
	}
	var ids []string
	for i := range 3 {
		ids = append(ids, submit(t, c, sleepers(t, fmt.Sprintf("sleepers-%d", i), 20, "    retryable_exit_codes: [75]\n")))
	}
	// Watch the quarantines until every job ended.
	most, polls := 0, 0
	deadline := time.Now().Add(90 * time.Second)
	for {
		if q := autoQuarantined(listNodes(t, c)); len(q) > most {
			most = len(q)
			if most > 1 {
				t.Fatalf("nodes %v quarantined automatically at once; --quarantine-max-share 0.25 of 4 allows 1", q)
			}
		}
		polls++
		ended := 0
		for _, id := range ids {
			j, err := getJob(c, id)
			if err != nil {
				t.Fatal(err)
			}
			switch j.GetState() {
			case apiaryv1.JobState_JOB_STATE_COMPLETE:
				ended++
			case apiaryv1.JobState_JOB_STATE_FAILED, apiaryv1.JobState_JOB_STATE_CANCELLED:
				t.Fatalf("job %s ended %s: counts %v", id, j.GetState(), j.GetCounts())
			}
		}
		if ended == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs not complete after 90s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, id := range ids {
		if j, _ := getJob(c, id); j.GetCounts().GetComplete() != 20 {
			t.Fatalf("job %s: counts %v", id, j.GetCounts())
		}
	}
	nodes := listNodes(t, c)
	q := autoQuarantined(nodes)
	if len(q) != 1 || (q[0] != "n1" && q[0] != "n2") {
		t.Fatalf("quarantined automatically: %v, want exactly one of the bad nodes n1, n2", q)
	}
	held, other := q[0], map[string]string{"n1": "n2", "n2": "n1"}[q[0]]
	checkAutoQuarantine(t, nodes[held])
	if o := nodes[other]; o.GetQuarantined() || o.GetRecentFailures() < 10 {
		t.Fatalf("%s (bad, refused by the guard): quarantined %v, failed %d of %d", other, o.GetQuarantined(), o.GetRecentFailures(), o.GetRecentAttempts())
	}
	for _, id := range []string{"n3", "n4"} {
		if n := nodes[id]; n.GetQuarantined() || n.GetRecentFailures() != 0 {
			t.Fatalf("healthy %s: quarantined %v, failed %d", id, n.GetQuarantined(), n.GetRecentFailures())
		}
	}
	if v := quarantineEvents(t, metricsAddr, "refused"); v < 1 {
		t.Fatalf("no refused quarantine event though %s failed %d of %d attempts", other, nodes[other].GetRecentFailures(), nodes[other].GetRecentAttempts())
	}
	if v := quarantineEvents(t, metricsAddr, "quarantined"); v != 1 {
		t.Fatalf("%v quarantined events, want 1", v)
	}
	if !strings.Contains(coordLog(t, r), "quarantine share guard refused") {
		t.Fatal("the coordinator did not log the guard's refusal")
	}
	t.Logf("%s quarantined (%s), %s refused; %d polls saw at most %d at once", held, nodes[held].GetQuarantineReason(), other, polls, most)

	// The operator releases the automatic quarantine.
	res := runApiary(t, "node", "release", held, "--addr", r.Addr())
	if res.code != 0 || !strings.Contains(res.stdout, "node "+held+" released") {
		t.Fatalf("node release %s: exit %d\n%s%s", held, res.code, res.stdout, res.stderr)
	}
	n := node(t, c, held)
	if n.GetQuarantined() || n.GetQuarantineAutomatic() || n.GetQuarantineReason() != "" || n.GetQuarantineStrikes() != 0 {
		t.Fatalf("%s after the operator's release: %v; want released, strikes forgotten (the operator vouches for it)", held, n)
	}
	if line := nodeListLine(t, r, held); !regexp.MustCompile(`\s0/0\s+eligible\s`).MatchString(line + " ") {
		t.Fatalf("node list after the release (window cleared, eligible): %s", line)
	}
	if res := runApiary(t, "node", "release", held, "--addr", r.Addr()); res.code != 0 || !strings.Contains(res.stdout, "was not quarantined") {
		t.Fatalf("second release: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
}

// TestBadNodeSpendsNoLastAttempt: a host that breaks after running other
// work fine (n1 ran a healthy job first) must not fail a job whatever its
// max_attempts: with max_attempts 1, a retryable exit (75) and a
// non-retryable one (1) on n1, before any quarantine, are confirmed on
// another node instead of spending the task's only attempt. A job of one
// task fails only where a second node confirms it.
func TestBadNodeSpendsNoLastAttempt(t *testing.T) {
	for _, code := range []int{75, 1} {
		t.Run(fmt.Sprintf("exit%d", code), func(t *testing.T) {
			env, script := badSleep(t, code)
			if err := os.Rename(script, script+".off"); err != nil { // healthy at first
				t.Fatal(err)
			}
			_, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{
				{ID: "n1", CPUMillis: 1000, Env: env}, {ID: "n2", CPUMillis: 1000}, {ID: "n3", CPUMillis: 1000},
			}})
			c := dial(t, r)
			if err := r.WaitNodes(t.Context(), 3); err != nil {
				t.Fatal(err)
			}
			warm := submit(t, c, sleepers(t, "history", 30, "    resources: {cpu_millis: 100}\n"))
			waitState(t, c, warm, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
			if n := node(t, c, "n1"); n.GetRecentAttempts() == 0 || n.GetRecentFailures() != 0 {
				t.Fatalf("n1 before it breaks: %d of %d failed; want successes only", n.GetRecentFailures(), n.GetRecentAttempts())
			}
			if err := os.Rename(script+".off", script); err != nil { // n1 breaks
				t.Fatal(err)
			}
			id := submit(t, c, spec(t, `
name: one-shot
max_attempts: 1
tasks:
  - name: s
    count: 20
    command: sleep
    args: ["1"]
    resources: {cpu_millis: 400}
    retryable_exit_codes: [75]
`))
			// 400 m: two tasks per node, so the 20 need all three nodes
			// (at 100 m, n2 and n3 could hold them all, and whether n1
			// got any was up to the engine's tie-breaking seed).
			j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 90*time.Second)
			if j.GetCounts().GetFailed() != 0 || j.GetCounts().GetComplete() != 20 {
				t.Fatalf("counts %v: a host that broke after running fine failed tasks with max_attempts 1", j.GetCounts())
			}
			onN1 := 0
			for _, tk := range logs(t, c, id) {
				for _, a := range ended(tk.GetAttempts()) {
					if a.GetNodeId() != "n1" {
						continue
					}
					onN1++
					if f := a.GetFault(); a.GetOutcome() != "retry" || (f != apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED && f != apiaryv1.FailureFault_FAILURE_FAULT_NODE) {
						t.Fatalf("task %d attempt %d on n1: %s fault %s (%s); want an uncharged retry", tk.GetIndex(), a.GetAttempt(), a.GetOutcome(), f, a.GetError())
					}
				}
			}
			if onN1 == 0 {
				t.Fatal("no attempt ran on n1 after it broke: the test exercised nothing")
			}
			t.Logf("exit %d: %d attempts on n1 after it broke, none charged; n1 quarantined: %v", code, onN1, node(t, c, "n1").GetQuarantineAutomatic())
		})
	}
}
