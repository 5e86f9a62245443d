package main

// End to end in one process: a coordinator (embedded etcd) and an agent
// share an in-memory span exporter; a job whose task fails once with a
// retryable exit code and then succeeds must yield one trace with the whole
// lifecycle, and both processes' /metrics must parse and move.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"apiary.dev/apiary/agent"
	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/regional"
)

func freePort(t *testing.T) string {
	t.Helper()
	return testutil.FreeAddr(t)
}

func TestJobLifecycleTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	regionTP := telemetry.NewProvider("apiary-region", "c1", 0, false, sdktrace.WithSyncer(exp))
	agentTP := telemetry.NewProvider("apiary-agent", "n1", 0, false, sdktrace.WithSyncer(exp))
	cliTP := telemetry.NewProvider("apiary-cli", "", 0, false, sdktrace.WithSyncer(exp))
	dir := t.TempDir()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	c, err := regional.New(regional.Config{ID: "c1", Region: "eu-west", Jurisdiction: "eu", ShardCount: 16,
		APIAddr: freePort(t), MetricsAddr: freePort(t), TracerProvider: regionTP, Logger: quiet,
		Etcd: regional.EtcdConfig{DataDir: filepath.Join(dir, "etcd"), ClientURL: "http://" + freePort(t), PeerURL: "http://" + freePort(t)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	agentMetrics := freePort(t)
	a, err := agent.New(agent.Config{NodeID: "n1", Capacity: agent.Resources{CPUMillis: 2000, MemoryMB: 2048},
		DataDir: filepath.Join(dir, "agent"), CoordinatorAddrs: []string{c.Addr()}, Logger: quiet,
		TracerProvider: agentTP, MetricsAddr: agentMetrics, KillGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan struct{})
	go func() { _ = a.Run(actx); close(adone) }()
	defer func() { acancel(); <-adone }()

	cc, err := grpc.NewClient(c.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(telemetry.GRPCClientHandler(cliTP)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	jobs := apiaryv1.NewJobServiceClient(cc)
	spec, err := jobspec.Parse([]byte(`
name: flaky
max_attempts: 3
tasks:
  - name: t
    command: sh
    args: ["-c", "if [ \"$APIARY_ATTEMPT\" = 1 ]; then echo busy >&2; exit 75; fi; echo done"]
    retryable_exit_codes: [75]
`))
	if err != nil {
		t.Fatal(err)
	}
	jobspec.ApplyDefaults(spec)
	sctx, submit := telemetry.Tracer(cliTP).Start(ctx, telemetry.SpanSubmit, trace.WithSpanKind(trace.SpanKindClient))
	resp, err := jobs.SubmitJob(sctx, &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: "test", RequestId: "r1",
		Traceparent: telemetry.Traceparent(sctx)})
	submit.End()
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetJobId()
	testutil.Eventually(t, 30*time.Second, "job complete", func() error {
		r, err := jobs.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: id})
		if err != nil {
			return err
		}
		if s := r.GetJob().GetState(); s != apiaryv1.JobState_JOB_STATE_COMPLETE {
			return fmt.Errorf("job %s", s)
		}
		return nil
	})
	traceID := submit.SpanContext().TraceID()
	lifecycle := map[string]bool{telemetry.SpanSubmit: true, telemetry.SpanRoute: true, telemetry.SpanAccept: true,
		telemetry.SpanPlace: true, telemetry.SpanDispatch: true, telemetry.SpanRun: true, telemetry.SpanRetry: true,
		telemetry.SpanComplete: true, telemetry.SpanFail: true}
	var spans tracetest.SpanStubs
	testutil.Eventually(t, 10*time.Second, "complete span exported", func() error {
		spans = nil
		for _, s := range exp.GetSpans() {
			if lifecycle[s.Name] && s.SpanContext.TraceID() == traceID {
				spans = append(spans, s)
			}
		}
		for _, s := range spans {
			if s.Name == telemetry.SpanComplete {
				return nil
			}
		}
		return fmt.Errorf("%d spans so far", len(spans))
	})
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].StartTime.Before(spans[j].StartTime) })
	var names []string
	for _, s := range spans {
		names = append(names, s.Name)
	}
	want := []string{"job.submit", "job.accept", "task.place", "task.dispatch", "task.run", "task.retry",
		"task.place", "task.dispatch", "task.run", "task.complete"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("lifecycle spans in order:\n got %v\nwant %v", names, want)
	}
	attr := func(s tracetest.SpanStub, k string) string {
		for _, kv := range s.Attributes {
			if string(kv.Key) == k {
				return kv.Value.Emit()
			}
		}
		return ""
	}
	for i, s := range spans[1:] {
		if attr(s, "apiary.job.id") != id || attr(s, "apiary.region") != "eu-west" {
			t.Errorf("%s: job/region attributes %v", s.Name, s.Attributes)
		}
		if i >= 1 {
			wantAttempt := "1"
			if i >= 5 {
				wantAttempt = "2"
			}
			if attr(s, "apiary.attempt") != wantAttempt || attr(s, "apiary.task.index") != "0" {
				t.Errorf("%s: attempt %q task %q, want attempt %s", s.Name, attr(s, "apiary.attempt"), attr(s, "apiary.task.index"), wantAttempt)
			}
		}
	}
	place1, run1, retry, place2, run2 := spans[2], spans[4], spans[5], spans[6], spans[8]
	for _, s := range []tracetest.SpanStub{place1, place2, run1, run2} {
		if attr(s, "apiary.node.id") != "n1" {
			t.Errorf("%s: node %q", s.Name, attr(s, "apiary.node.id"))
		}
	}
	if attr(place1, "apiary.shard") == "" || attr(place1, "apiary.epoch") == "" || attr(place1, "apiary.placement.score") == "" {
		t.Errorf("place attributes %v", place1.Attributes)
	}
	if run1.Status.Code.String() != "Error" || attr(run1, "process.exit.code") != "75" || attr(run2, "process.exit.code") != "0" ||
		run2.Status.Code.String() == "Error" || retry.Status.Code.String() != "Error" {
		t.Errorf("run 1 %v exit %s; run 2 %v exit %s; retry %v", run1.Status, attr(run1, "process.exit.code"),
			run2.Status, attr(run2, "process.exit.code"), retry.Status)
	}
	if attr(run2, "apiary.output.bytes") != "5" {
		t.Errorf("run 2 output bytes %q", attr(run2, "apiary.output.bytes"))
	}
	// The run is a child of its dispatch; the second placement links to the
	// run of the attempt it replaces.
	if run1.Parent.SpanID() != spans[3].SpanContext.SpanID() {
		t.Errorf("run 1 parent %s, dispatch %s", run1.Parent.SpanID(), spans[3].SpanContext.SpanID())
	}
	if len(place2.Links) != 1 || place2.Links[0].SpanContext.SpanID() != run1.SpanContext.SpanID() {
		t.Errorf("place 2 links %+v, run 1 %s", place2.Links, run1.SpanContext.SpanID())
	}

	// Metrics of both processes parse and have moved.
	region := testutil.ScrapeMetrics(t, "http://"+c.MetricsAddr()+"/metrics")
	for name, min := range map[string]float64{"apiary_job_submissions_total": 1, "apiary_placements_total": 2,
		"apiary_task_retries_total": 1, "apiary_task_reports_total": 2, "apiary_shard_owner": 1} {
		if v := testutil.MetricSum(region[name]); v < min {
			t.Errorf("region %s = %v, want >= %v", name, v, min)
		}
	}
	if h := region["apiary_task_submit_to_complete_seconds"]; h == nil || h.GetMetric()[0].GetHistogram().GetSampleCount() != 1 {
		t.Errorf("submit-to-complete histogram %v", h)
	}
	ag := testutil.ScrapeMetrics(t, "http://"+agentMetrics+"/metrics")
	if v := testutil.MetricSum(ag["apiary_agent_attempts_total"]); v != 2 {
		t.Errorf("agent attempts %v", v)
	}
	if ag["apiary_agent_free_capacity"] == nil || ag["apiary_agent_running_tasks"] == nil {
		t.Error("agent capacity gauges missing")
	}
}
