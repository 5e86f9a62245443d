package loadtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"apiary.dev/apiary/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

// TestScenariosKeepPromises runs each scenario briefly on real processes
// (one fault, light load) and asserts the verifier's verdict: nothing lost,
// no duplicate completion, no stale effect with a newer token, no
// sovereignty violation, and the fault was measured.
func TestScenariosKeepPromises(t *testing.T) {
	for _, sc := range Scenarios {
		t.Run(string(sc), func(t *testing.T) {
			o := Options{Scenario: sc, Rate: 20, Binary: testutil.Binary(t), WorkDir: t.TempDir(),
				Agents: 2, Slots: 8, TaskSleep: 500 * time.Millisecond, DrainTimeout: 45 * time.Second}
			if sc == Steady {
				o.Duration = 2 * time.Second
			} else {
				o.Trials, o.TrialEvery = 1, 4*time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res, err := Run(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Verdict.OK() {
				t.Fatalf("verdict: %s", res.Verdict.Error())
			}
			if res.Accepted != res.Submitted || res.Completed != res.Accepted || res.Accepted == 0 {
				t.Fatalf("submitted %d accepted %d completed %d failed %d", res.Submitted, res.Accepted, res.Completed, res.Failed)
			}
			if sc != Steady && res.ValidTrials != 1 {
				t.Fatalf("fault not measured: %+v", res.TrialDetails)
			}
			if dir := t.TempDir(); WriteResults(dir, res, "test") != nil {
				t.Fatal("write results")
			}
		})
	}
}

// TestTraceReplay replays the first pods of the real trace as jobs and
// verifies them like any other run.
func TestTraceReplay(t *testing.T) {
	bin := testutil.Binary(t) // built before the deadline runs
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{Scenario: Steady, Binary: bin, WorkDir: t.TempDir(), Agents: 2, Slots: 8,
		Trace: filepath.Join("..", "..", "shared", "traces", "alibaba-gpu-v2023", "openb_pod_list_default.csv"), TraceLimit: 40,
		Duration: 2 * time.Second, MaxTaskSleep: 300 * time.Millisecond, DrainTimeout: 45 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Verdict.OK() || res.Submitted != 40 || res.Accepted+res.Refused != 40 || res.Completed != res.Accepted || res.Accepted < 30 {
		t.Fatalf("replay: submitted %d accepted %d refused %d completed %d; %s", res.Submitted, res.Accepted, res.Refused, res.Completed, res.Verdict.Error())
	}
}
