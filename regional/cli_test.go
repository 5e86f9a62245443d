package regional_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// The CLI commands that need a real region, run as the built binary.

type cliRun struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func runApiary(t *testing.T, args ...string) cliRun {
	t.Helper()
	cmd := exec.Command(testutil.Binary(t), args...)
	cmd.Env = append(os.Environ(), "APIARY_ADDR=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := cliRun{stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("apiary %v: %v", args, err)
	}
	return r
}

// `job run --wait --wait-timeout` on a job no node can run (a constraint no
// node matches passes admission) stops at the timeout with exit 4, says why
// the job waits and how to follow it, and the job keeps existing.
func TestCLIWaitTimeoutOnUnplaceableJob(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Agents: twoAgents()})
	c := dial(t, r)
	// The unplaced reason is written once the task has waited 2 s in an
	// owner's rounds; a fresh coordinator claims its shards only after
	// --shard-settle (2 s), so submit once it owns them.
	waitShardsSpread(t, c, 1)
	f := filepath.Join(t.TempDir(), "mars.yaml")
	if err := os.WriteFile(f, []byte(`
name: mars
tasks:
  - name: main
    command: "true"
    constraints:
      - {label: zone, op: "=", values: [mars]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	const wt = 4 * time.Second
	res := runApiary(t, "job", "run", f, "--wait", "--wait-timeout", wt.String(), "--addr", r.Addr())
	t.Logf("exit %d after %v\nstdout:\n%s\nstderr:\n%s", res.code, res.took, res.stdout, res.stderr)
	if res.code != 4 {
		t.Fatalf("exit %d, want 4 (--wait-timeout)", res.code)
	}
	if res.took < wt || res.took > wt+4*time.Second {
		t.Fatalf("took %v with --wait-timeout %v", res.took, wt)
	}
	m := regexp.MustCompile(`submitted mars as (\S+) `).FindStringSubmatch(res.stderr)
	if m == nil {
		t.Fatal("no job id on stderr")
	}
	id := m[1]
	for _, want := range []string{
		"waiting: constraint zone = mars: 2 nodes", // the progress line
		"keeps running", // the exit message
		fmt.Sprintf("`apiary job status %s`", id),    // how to follow it
		"(waiting: constraint zone = mars: 2 nodes)", // why, in the exit message
		fmt.Sprintf("stopped waiting after --wait-timeout %s", wt),
	} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if !strings.Contains(res.stdout, id) || !strings.Contains(res.stdout, "PENDING") {
		t.Errorf("stdout lacks the job's last state")
	}
	j, err := getJob(c, id)
	if err != nil || j.GetState() != apiaryv1.JobState_JOB_STATE_PENDING {
		t.Fatalf("after the timeout the job is %v (%v), want still PENDING", j.GetState(), err)
	}
	// An invalid --wait-timeout is refused before anything is sent.
	if res := runApiary(t, "job", "run", f, "--wait-timeout", "-1s", "--addr", r.Addr()); res.code != 2 || !strings.Contains(res.stderr, "--wait-timeout") {
		t.Fatalf("--wait-timeout -1s: exit %d: %s", res.code, res.stderr)
	}
}

// `region status` names the coordinator that schedules; after it is killed,
// it names the new one. `region list` against a coordinator (no WAN pool)
// lists its own region with its members.
func TestCLIRegionStatusNamesScheduler(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Coordinators: 3, Agents: []devcluster.AgentSpec{{ID: "n1"}}})
	status := func() (*apiaryv1.GetRegionInfoResponse, cliRun) {
		t.Helper()
		res := runApiary(t, "region", "status", "-o", "json", "--addr", r.Addr())
		if res.code != 0 {
			return nil, res
		}
		var info apiaryv1.GetRegionInfoResponse
		if err := protojson.Unmarshal([]byte(res.stdout), &info); err != nil {
			t.Fatalf("region status -o json: %v\n%s", err, res.stdout)
		}
		return &info, res
	}
	var info *apiaryv1.GetRegionInfoResponse
	testutil.Eventually(t, 20*time.Second, "a scheduler and 3 members", func() error {
		var res cliRun
		if info, res = status(); info == nil {
			return fmt.Errorf("exit %d: %s", res.code, res.stderr)
		}
		if info.GetScheduler() == "" || len(info.GetCoordinators()) != 3 || info.GetEtcdLeader() == "" {
			return fmt.Errorf("%v", info)
		}
		return nil
	})
	first := info.GetScheduler()
	if info.GetRegion() != "eu-west" || info.GetNodesReady() != 1 || info.GetNodesRegistered() != 1 {
		t.Fatalf("region status: %v", info)
	}
	text := runApiary(t, "region", "status", "--addr", r.Addr())
	t.Logf("region status:\n%s%s", text.stdout, text.stderr)
	if text.code != 0 || !regexp.MustCompile(`Shards:\s+256 \(`).MatchString(text.stdout) ||
		!regexp.MustCompile(`(?m)^`+first+`\s+127\.0\.0\.1:\d+\s+answers\s+\d+\s+scheduler`).MatchString(text.stdout) ||
		!regexp.MustCompile(`etcd leader:\s+eu-west-c\d`).MatchString(text.stdout) {
		t.Fatalf("text output does not name the scheduler %s", first)
	}

	list := runApiary(t, "region", "list", "--addr", r.APIAddrs[0])
	t.Logf("region list against a coordinator:\n%s%s", list.stdout, list.stderr)
	if list.code != 0 || !strings.Contains(list.stdout, "eu-west") || strings.Count(list.stdout, "(alive,answers") != 3 {
		t.Fatalf("region list against a coordinator: exit %d", list.code)
	}

	idx := -1
	for i, p := range r.Coords {
		if p.Name == first {
			idx = i
		}
	}
	if idx < 0 {
		t.Fatalf("scheduler %q is none of the coordinators", first)
	}
	if err := r.Coords[idx].Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testutil.Eventually(t, 30*time.Second, "a new scheduler", func() error {
		var res cliRun
		if info, res = status(); info == nil {
			return fmt.Errorf("exit %d: %s", res.code, res.stderr)
		}
		if s := info.GetScheduler(); s == "" || s == first {
			return fmt.Errorf("scheduler %q", s)
		}
		return nil
	})
	second := info.GetScheduler()
	t.Logf("scheduler %s killed; region status named %s after %v", first, second, time.Since(start).Round(100*time.Millisecond))
	text = runApiary(t, "region", "status", "--addr", r.Addr())
	t.Logf("region status:\n%s%s", text.stdout, text.stderr)
	if text.code != 0 || !regexp.MustCompile(`(?m)^`+second+`\s+127\.0\.0\.1:\d+\s+answers\s+\d+\s+scheduler`).MatchString(text.stdout) {
		t.Fatalf("text output does not name the new scheduler %s", second)
	}
	// The killed member, while its record has not lapsed, does not answer.
	if strings.Contains(text.stdout, "\n"+first+" ") &&
		!regexp.MustCompile(`(?m)^`+first+`\s+127\.0\.0\.1:\d+\s+no answer \(connection refused\)`).MatchString(text.stdout) {
		t.Fatalf("the killed %s is listed as answering", first)
	}
}
