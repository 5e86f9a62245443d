package telemetry

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"apiary.dev/apiary/internal/testutil"
)

func memProvider() (*tracetest.InMemoryExporter, trace.TracerProvider) {
	exp := tracetest.NewInMemoryExporter()
	return exp, NewProvider("test", "t1", 0, false, sdktrace.WithSyncer(exp))
}

func TestTraceparentRoundTrip(t *testing.T) {
	exp, tp := memProvider()
	tr := Tracer(tp)
	ctx, root := tr.Start(context.Background(), SpanSubmit)
	stored := Traceparent(ctx)
	if !strings.HasPrefix(stored, "00-"+root.SpanContext().TraceID().String()+"-") {
		t.Fatalf("traceparent %q", stored)
	}
	root.End()
	// Later, elsewhere: a child of the stored traceparent.
	_, child := StartFromTraceparent(context.Background(), tr, stored, SpanPlace)
	child.End()
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	if spans[1].SpanContext.TraceID() != spans[0].SpanContext.TraceID() || spans[1].Parent.SpanID() != spans[0].SpanContext.SpanID() {
		t.Fatalf("child not joined: %v / %v", spans[1].Parent, spans[0].SpanContext)
	}
	if Traceparent(context.Background()) != "" || SpanContextOf("junk").IsValid() {
		t.Fatal("empty context or junk traceparent should give nothing")
	}
	if got := ContextWithTraceparent(context.Background(), ""); trace.SpanContextFromContext(got).IsValid() {
		t.Fatal("empty traceparent made a span context")
	}
}

func TestAttemptSpanIDAndLink(t *testing.T) {
	exp, tp := memProvider()
	tr := Tracer(tp)
	ctx, root := tr.Start(context.Background(), SpanSubmit)
	stored := Traceparent(ctx)
	root.End()
	rctx := WithAttemptSpanID(ContextWithTraceparent(context.Background(), stored), "j1", 3, 1)
	_, run := tr.Start(rctx, SpanRun)
	run.End()
	if run.SpanContext().SpanID() != AttemptSpanID("j1", 3, 1) {
		t.Fatal("run span did not take the attempt's id")
	}
	if AttemptSpanID("j1", 3, 1) == AttemptSpanID("j1", 3, 2) || AttemptSpanID("j1", 3, 1) == AttemptSpanID("j1", 4, 1) {
		t.Fatal("attempt ids collide")
	}
	l, ok := AttemptLink(stored, "j1", 3, 1, "retry_of")
	if !ok {
		t.Fatal("no link")
	}
	_, next := StartFromTraceparent(context.Background(), tr, stored, SpanPlace, trace.WithLinks(l))
	next.End()
	// A span started without the key gets a random id.
	_, other := tr.Start(ContextWithTraceparent(context.Background(), stored), SpanDispatch)
	other.End()
	spans := exp.GetSpans()
	placed := spans[2]
	if len(placed.Links) != 1 || placed.Links[0].SpanContext.SpanID() != run.SpanContext().SpanID() ||
		placed.Links[0].SpanContext.TraceID() != run.SpanContext().TraceID() {
		t.Fatalf("link %+v", placed.Links)
	}
	if spans[3].SpanContext.SpanID() == run.SpanContext().SpanID() {
		t.Fatal("id leaked to a later span")
	}
}

func TestFileExporterRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	p, err := Setup(context.Background(), Options{ServiceName: "apiary-test", InstanceID: "i1", File: path, Sync: true,
		Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Enabled {
		t.Fatal("file exporter should enable tracing")
	}
	tr := Tracer(p)
	ctx, s := tr.Start(context.Background(), SpanAccept, trace.WithAttributes(AttrJobID.String("j1"), AttrTaskIndex.Int(2)))
	_, c := tr.Start(ctx, SpanRun)
	RecordError(c, io.ErrUnexpectedEOF)
	c.AddEvent("process.exit", trace.WithAttributes(AttrExitCode.Int(3)))
	c.End()
	s.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadSpanFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("%d records", len(recs))
	}
	run, acc := recs[0], recs[1]
	if run.ParentSpanID != acc.SpanID || run.TraceID != acc.TraceID || run.StatusCode != "error" ||
		run.StatusMsg != io.ErrUnexpectedEOF.Error() || len(run.Events) < 1 {
		t.Fatalf("run record %+v", run)
	}
	if acc.Attr(AttrJobID) != "j1" || acc.Attr(AttrTaskIndex) != "2" || acc.Service != "apiary-test" || acc.Instance != "i1" {
		t.Fatalf("accept record %+v", acc)
	}
	// A torn line is skipped.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"trace_id":"ab`)
	f.Close()
	if recs, _ := ReadSpanFile(path); len(recs) != 2 {
		t.Fatalf("torn line: %d records", len(recs))
	}
}

func TestSetupOffByDefault(t *testing.T) {
	p, err := Setup(context.Background(), Options{ServiceName: "x", Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if p.Enabled {
		t.Fatal("tracing should be off without OTEL_* or a file")
	}
	_, s := Tracer(p).Start(context.Background(), "x")
	if s.IsRecording() {
		t.Fatal("no-op span records")
	}
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}
	if _, err := Setup(context.Background(), Options{Getenv: func(k string) string { return env[k] }}); err == nil {
		t.Fatal("unknown protocol accepted")
	}
	env["OTEL_SDK_DISABLED"] = "true"
	if p, err := Setup(context.Background(), Options{Getenv: func(k string) string { return env[k] }}); err != nil || p.Enabled {
		t.Fatalf("OTEL_SDK_DISABLED: %v %v", p, err)
	}
}

func TestLogHandlerAddsIDs(t *testing.T) {
	_, tp := memProvider()
	var buf bytes.Buffer
	log, err := NewLogger("json", &buf)
	if err != nil {
		t.Fatal(err)
	}
	ctx, s := Tracer(tp).Start(context.Background(), "x")
	log.With("k", "v").InfoContext(ctx, "in span")
	log.Info("no span")
	s.End()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if !strings.Contains(lines[0], `"trace_id":"`+s.SpanContext().TraceID().String()) ||
		!strings.Contains(lines[0], `"span_id":"`+s.SpanContext().SpanID().String()) || !strings.Contains(lines[0], `"k":"v"`) {
		t.Fatalf("line %s", lines[0])
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Fatalf("line without span has ids: %s", lines[1])
	}
	if _, err := NewLogger("xml", io.Discard); err == nil {
		t.Fatal("xml accepted")
	}
	var _ slog.Handler = NewLogHandler(slog.NewTextHandler(io.Discard, nil))
}

// traceReceiver is an OTLP collector TraceService that keeps what arrives.
type traceReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names []string
	attrs map[string]string
}

func (r *traceReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.record(req)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *traceReceiver) record(req *collectortrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attrs == nil {
		r.attrs = map[string]string{}
	}
	for _, rs := range req.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			r.attrs[a.GetKey()] = a.GetValue().GetStringValue()
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.names = append(r.names, s.GetName())
				for _, a := range s.GetAttributes() {
					r.attrs[a.GetKey()] = a.GetValue().String()
				}
			}
		}
	}
}

func (r *traceReceiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.names...)
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestOTLPGRPCExport(t *testing.T) {
	lis := testutil.Listen(t)
	srv := grpc.NewServer()
	rcv := &traceReceiver{}
	collectortrace.RegisterTraceServiceServer(srv, rcv)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+lis.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	p, err := Setup(context.Background(), Options{ServiceName: "apiary-region", InstanceID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	_, s := Tracer(p).Start(context.Background(), SpanAccept, trace.WithAttributes(AttrJobID.String("eu-1")))
	s.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil { // flushes the batch
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "span over OTLP/gRPC", func() bool { return len(rcv.got()) == 1 })
	if rcv.got()[0] != SpanAccept || rcv.attrs["service.name"] != "apiary-region" || !strings.Contains(rcv.attrs["apiary.job.id"], "eu-1") {
		t.Fatalf("received %v %v", rcv.got(), rcv.attrs)
	}
}

func TestOTLPHTTPExport(t *testing.T) {
	rcv := &traceReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		rcv.record(&req)
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	p, err := Setup(context.Background(), Options{ServiceName: "apiary-agent", Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	_, s := Tracer(p).Start(context.Background(), SpanRun)
	s.End()
	_ = p.Shutdown(context.Background())
	eventually(t, 10*time.Second, "span over OTLP/HTTP", func() bool { return len(rcv.got()) == 1 })
}

func TestMetricsServerParses(t *testing.T) {
	reg := NewRegistry()
	rm := NewRegionMetrics(reg)
	am := NewAgentMetrics(reg, func() float64 { return 2 }, func() map[string]float64 {
		return map[string]float64{"cpu_millis": 1500, "memory_mb": 512, "gpus": 0}
	}, map[string]float64{"cpu_millis": 4000})
	rm.Submissions.WithLabelValues("accepted").Add(3)
	rm.PendingTasks.WithLabelValues(ShardLabel(7)).Set(4)
	rm.ToDispatch.Observe(0.2)
	am.Attempts.WithLabelValues("exited").Inc()
	srv, err := Serve(testutil.FreeAddr(t), reg, true)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	fams := testutil.ScrapeMetrics(t, "http://"+srv.Addr()+"/metrics")
	for name, want := range map[string]float64{
		"apiary_job_submissions_total": 3, "apiary_pending_tasks": 4, "apiary_agent_running_tasks": 2,
		"apiary_agent_attempts_total": 1,
	} {
		f := fams[name]
		if f == nil || len(f.GetMetric()) == 0 {
			t.Fatalf("%s missing", name)
		}
		m := f.GetMetric()[0]
		got := m.GetCounter().GetValue() + m.GetGauge().GetValue()
		if got != want {
			t.Fatalf("%s = %v, want %v", name, got, want)
		}
	}
	if fams["apiary_agent_free_capacity"] == nil || fams["apiary_task_submit_to_dispatch_seconds"].GetMetric()[0].GetHistogram().GetSampleCount() != 1 {
		t.Fatal("free capacity or histogram missing")
	}
	if resp, err := http.Get("http://" + srv.Addr() + "/debug/pprof/"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("pprof: %v", err)
	}
}
