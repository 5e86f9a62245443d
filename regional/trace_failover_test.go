package regional_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/internal/testutil"
)

// TestTraceSurvivesSchedulerKill: the job's W3C trace context is stored with
// it, so after a SIGKILL of the scheduling coordinator the successor's place
// and dispatch spans (and the agents' run spans) join the submission's trace.
func TestTraceSurvivesSchedulerKill(t *testing.T) {
	dir := t.TempDir()
	traceFile := filepath.Join(dir, "traces.jsonl")
	agents := twoAgents()
	for i := range agents {
		agents[i].MaxTasks = 4
	}
	bin := testutil.Binary(t) // built before the start deadline runs
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl := startCluster(t, ctx, devcluster.Options{Binary: bin, Dir: dir,
		ExtraEnv: []string{telemetry.EnvTraceFile + "=" + traceFile},
		Regions: []devcluster.RegionSpec{{Name: "eu-west", Jurisdiction: "eu", Coordinators: 3, Agents: agents,
			ExtraArgs: []string{"--node-lease-ttl", "1s"}}}})
	r := cl.Regions[0]
	c := dial(t, r)

	var tid [16]byte
	var sid [8]byte
	_, _ = rand.Read(tid[:])
	_, _ = rand.Read(sid[:])
	traceID := hex.EncodeToString(tid[:])
	s := spec(t, `
name: traced
tasks:
  - name: step
    count: 24
    command: sh
    args: ["-c", "sleep 0.3"]
`)
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := c.jobs.SubmitJob(sctx, &apiaryv1.SubmitJobRequest{Spec: s, ClientId: "t", RequestId: "trace-1",
		Traceparent: "00-" + traceID + "-" + hex.EncodeToString(sid[:]) + "-01"})
	scancel()
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetJobId()
	testutil.Eventually(t, 30*time.Second, "some tasks complete", func() error {
		j, err := getJob(c, id)
		if err != nil {
			return err
		}
		if j.GetCounts().GetComplete() < 4 {
			return fmt.Errorf("counts %v", j.GetCounts())
		}
		return nil
	})
	info := regionInfo(t, c)
	var killed string
	for _, co := range info.GetCoordinators() {
		if co.GetScheduler() {
			killed = co.GetId()
		}
	}
	for _, p := range r.Coords {
		if p.Name == killed {
			if err := p.Kill(); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
	var spans []telemetry.SpanRecord
	testutil.Eventually(t, 10*time.Second, "successor spans in the job's trace", func() error {
		var err error
		if spans, err = telemetry.ReadSpanFile(traceFile); err != nil {
			return err
		}
		places, byOthers, runs := 0, 0, 0
		for _, sp := range spans {
			if sp.TraceID != traceID {
				continue
			}
			switch sp.Name {
			case telemetry.SpanPlace:
				places++
				if sp.Instance != killed {
					byOthers++
				}
			case telemetry.SpanRun:
				runs++
			}
		}
		// The killed coordinator's unexported spans die with it (SIGKILL);
		// the successor's and the agents' must all be in the trace.
		if byOthers == 0 || runs < 24 {
			return fmt.Errorf("in trace %s: %d place spans (%d by a successor of %s), %d run spans", traceID, places, byOthers, killed, runs)
		}
		return nil
	})
	for _, sp := range spans {
		if sp.Name == telemetry.SpanPlace && sp.Attr(telemetry.AttrJobID) == id && sp.TraceID != traceID {
			t.Fatalf("place span of job %s outside its trace: %+v", id, sp)
		}
	}
}
