package regional_test

// Issue 19 (security review): AgentService.ExportSpans keeps only spans of
// attempts the calling node ran, so an agent cannot write into the trace
// of a job that never ran on it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/internal/testutil"
)

// shippedSpan is the part of a span-file record the test reads and writes.
type shippedSpan struct {
	TraceID    string         `json:"trace_id"`
	SpanID     string         `json:"span_id"`
	ParentID   string         `json:"parent_span_id,omitempty"`
	Name       string         `json:"name"`
	Start      time.Time      `json:"start"`
	End        time.Time      `json:"end"`
	Attributes map[string]any `json:"attributes,omitempty"`
}

// jobTraceSpans reads the job's trace from the region (every coordinator).
func jobTraceSpans(t *testing.T, c clients, id string) []shippedSpan {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	tr, err := c.jobs.GetJobTrace(ctx, &apiaryv1.GetJobTraceRequest{JobId: id})
	if err != nil {
		t.Fatalf("GetJobTrace %s: %v", id, err)
	}
	var out []shippedSpan
	for _, line := range bytes.Split(tr.GetSpansJsonl(), []byte{'\n'}) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var s shippedSpan
		if err := json.Unmarshal(line, &s); err != nil {
			t.Fatalf("GetJobTrace %s: line %q: %v", id, line, err)
		}
		out = append(out, s)
	}
	return out
}

// TestExportSpansRefusesOtherNodesJobs: in a region with mutual TLS and two
// agents, a job runs on one of them (the victim); the other agent, with its
// own valid certificate and node id, ships spans into that job's trace
// (naming the job and its attempt, with its own node id or the victim's,
// or only the job's trace id). None is kept (Kept 0), none appears in
// GetJobTrace, the coordinator logs one WARN naming the node and the job,
// and the victim's genuine task.run span is still there; the victim
// itself shipping another span of its attempt is kept (the check is not a
// blanket refusal).
func TestExportSpansRefusesOtherNodesJobs(t *testing.T) {
	cl, r := tlsCluster(t, devcluster.RegionSpec{Agents: twoAgents()}, false)
	c := dial(t, r)
	if err := r.WaitNodes(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	id := submit(t, c, spec(t, "name: traced\nmax_attempts: 1\ntasks:\n  - name: t\n    command: \"true\"\n"))
	j := waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	victim := j.GetTasks()[0].GetAttempts()[0].GetNodeId()
	other := map[string]string{"n1": "n2", "n2": "n1"}[victim]
	if other == "" {
		t.Fatalf("job ran on %q, want n1 or n2", victim)
	}

	// The genuine task.run span, shipped by the victim's agent.
	var run shippedSpan
	testutil.Eventually(t, 20*time.Second, "the victim's task.run span in the job's trace", func() error {
		for _, s := range jobTraceSpans(t, c, id) {
			if s.Name == telemetry.SpanRun && s.Attributes[string(telemetry.AttrNodeID)] == victim {
				run = s
				return nil
			}
		}
		return fmt.Errorf("no %s span of node %s", telemetry.SpanRun, victim)
	})

	p := cl.PKI()
	asNode := func(node string) clients {
		f, err := p.Cert(pki.RoleAgent, r.Spec.Name, node)
		if err != nil {
			t.Fatal(err)
		}
		return clientsOver(t, r, f)
	}
	now := time.Now()
	forge := func(name string, spanID string, attrs map[string]any) []byte {
		b, err := json.Marshal(shippedSpan{TraceID: run.TraceID, SpanID: spanID, Name: name, Start: now, End: now, Attributes: attrs})
		if err != nil {
			t.Fatal(err)
		}
		return append(b, '\n')
	}
	attemptOf := func(node string) map[string]any {
		return map[string]any{string(telemetry.AttrJobID): id, string(telemetry.AttrTaskIndex): 0,
			string(telemetry.AttrAttempt): 1, string(telemetry.AttrNodeID): node}
	}
	var forged []byte
	forged = append(forged, forge("forged.own-node", "00000000000000a1", attemptOf(other))...)
	forged = append(forged, forge("forged.victim-node", "00000000000000a2", attemptOf(victim))...)
	forged = append(forged, forge("forged.no-job", "00000000000000a3", map[string]any{string(telemetry.AttrNodeID): other})...)

	ship := func(c clients, node string, spans []byte) int32 {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		resp, err := c.agent.ExportSpans(ctx, &apiaryv1.ExportSpansRequest{NodeId: node, SpansJsonl: spans})
		if err != nil {
			t.Fatalf("ExportSpans as %s: %v", node, err)
		}
		return resp.GetKept()
	}
	if kept := ship(asNode(other), other, forged); kept != 0 {
		t.Errorf("ExportSpans as %s of %s's job: kept %d spans, want 0", other, victim, kept)
	}
	// The victim's own agent shipping another span of its attempt is kept.
	if kept := ship(asNode(victim), victim, forge("reshipped.genuine", "00000000000000b1", attemptOf(victim))); kept != 1 {
		t.Errorf("ExportSpans as %s of its own attempt: kept %d spans, want 1", victim, kept)
	}

	names := map[string]bool{}
	genuine := false
	for _, s := range jobTraceSpans(t, c, id) {
		names[s.Name] = true
		if s.Name == telemetry.SpanRun && s.SpanID == run.SpanID && s.Attributes[string(telemetry.AttrNodeID)] == victim {
			genuine = true
		}
	}
	for n := range names {
		if strings.HasPrefix(n, "forged.") {
			t.Errorf("GetJobTrace %s holds %s's forged span %q", id, other, n)
		}
	}
	if !genuine {
		t.Errorf("GetJobTrace %s lost %s's genuine %s span; spans %v", id, victim, telemetry.SpanRun, names)
	}
	if !names["reshipped.genuine"] {
		t.Errorf("GetJobTrace %s lacks the span %s shipped of its own attempt; spans %v", id, victim, names)
	}

	b, err := os.ReadFile(r.Coords[0].LogPath)
	if err != nil {
		t.Fatal(err)
	}
	var warns []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "refused spans shipped by an agent") {
			warns = append(warns, l)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "level=WARN") || !strings.Contains(warns[0], "node="+other) ||
		!strings.Contains(warns[0], id) || !strings.Contains(warns[0], "refused=3") {
		t.Errorf("coordinator log: want one WARN for the call naming node=%s, job %s and refused=3; got %q", other, id, warns)
	}
}

// TestJobTraceHoldsOnlyItsJob: SubmitJobRequest.traceparent is the
// client's to set, so a second job (the intruder) can be submitted into
// the trace of another (the victim), gRPC metadata included. Both run on a
// real region; GetJobTrace of each returns only that job's spans (its
// apiary.job.id) and its own SubmitJob server span (the parent of its
// job.accept), none of the other's, though all share one trace id.
func TestJobTraceHoldsOnlyItsJob(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Agents: twoAgents()})
	c := dial(t, r)
	if err := r.WaitNodes(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	tp := "00-" + traceID + "-00f067aa0ba902b7-01" // the victim's client span
	submitInto := func(name string) string {
		t.Helper()
		// As `apiary job run` with tracing on: the traceparent in the
		// request and in the gRPC metadata (otelgrpc's server span joins it).
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "traceparent", tp), 10*time.Second)
		defer cancel()
		resp, err := c.jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Traceparent: tp, ClientId: "test", RequestId: name,
			Spec: spec(t, "name: "+name+"\nmax_attempts: 1\ntasks:\n  - name: t\n    command: \"true\"\n")})
		if err != nil {
			t.Fatalf("submit %s: %v", name, err)
		}
		return resp.GetJobId()
	}
	victim, intruder := submitInto("victim"), submitInto("intruder")
	jobs := map[string]string{victim: "victim", intruder: "intruder"}
	for id := range jobs {
		waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	}
	// Every span of both jobs is buffered (the agents' task.run spans come
	// about a second after the run) before either trace is judged, so the
	// intruder's spans are there to be wrongly returned.
	traces := map[string][]shippedSpan{}
	for id, who := range jobs {
		testutil.Eventually(t, 20*time.Second, "the "+who+"'s task.run span", func() error {
			traces[id] = jobTraceSpans(t, c, id)
			for _, s := range traces[id] {
				if s.Name == telemetry.SpanRun {
					return nil
				}
			}
			return fmt.Errorf("no %s span among %d", telemetry.SpanRun, len(traces[id]))
		})
	}
	for id, who := range jobs {
		var accept shippedSpan
		var anon []shippedSpan
		names := map[string]int{}
		for _, s := range traces[id] {
			names[s.Name]++
			if s.TraceID != traceID {
				t.Errorf("%s's trace: span %s in trace %s, want %s", who, s.Name, s.TraceID, traceID)
			}
			switch j, _ := s.Attributes[string(telemetry.AttrJobID)].(string); j {
			case id:
				if s.Name == telemetry.SpanAccept {
					accept = s
				}
			case "":
				anon = append(anon, s)
			default:
				t.Errorf("%s's trace holds span %s of job %s (%s)", who, s.Name, j, jobs[j])
			}
		}
		for _, want := range []string{telemetry.SpanAccept, telemetry.SpanPlace, telemetry.SpanDispatch, telemetry.SpanRun, telemetry.SpanComplete} {
			if names[want] != 1 {
				t.Errorf("%s's trace: %d %s spans, want 1; spans %v", who, names[want], want, names)
			}
		}
		// The one span without the job attribute: the server span of its
		// own SubmitJob, not the other job's.
		if len(anon) != 1 || anon[0].Name != "apiary.v1.JobService/SubmitJob" || accept.ParentID == "" || anon[0].SpanID != accept.ParentID {
			t.Errorf("%s's trace: spans without %s %+v, want only the SubmitJob span %s that is its job.accept's parent",
				who, telemetry.AttrJobID, anon, accept.ParentID)
		}
	}
}
