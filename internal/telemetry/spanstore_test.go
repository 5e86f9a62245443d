package telemetry

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// placeSpan ends a span shaped like a coordinator's task.place (the
// attributes a lifecycle span carries) in the trace of tp (a traceparent).
func placeSpan(tr trace.Tracer, tp, job string, attempt int) {
	_, s := StartFromTraceparent(context.Background(), tr, tp, SpanPlace, trace.WithAttributes(
		AttrJobID.String(job), AttrRegion.String("eu-west"), AttrTaskIndex.Int(0), AttrAttempt.Int(attempt),
		AttrNodeID.String("eu-n1"), AttrShard.Int(113), AttrEpoch.Int64(42), AttrScore.Float64(0.8125),
		AttrConflict.Bool(false), AttrCoord.String("c1")))
	s.End()
}

func rootOf(tr trace.Tracer, job string) string {
	ctx, s := tr.Start(context.Background(), SpanAccept, trace.WithAttributes(AttrJobID.String(job)))
	s.End()
	return Traceparent(ctx)
}

func lines(b []byte) []SpanRecord {
	recs, _ := ReadSpans(bytes.NewReader(b))
	return recs
}

// TestSpanStoreJobTraces: a job's query returns every span of its traces
// (also spans without the job attribute, and spans shipped by another
// process), nothing of other jobs; the oldest spans go first when full;
// spans older than the age bound are not returned.
func TestSpanStoreJobTraces(t *testing.T) {
	st := NewSpanStore(8, time.Hour)
	tp := NewProvider("apiary-region", "c1", 0, false, sdktrace.WithSpanProcessor(st))
	tr := Tracer(tp)
	a := rootOf(tr, "eu-west-a")
	b := rootOf(tr, "eu-west-b")
	_, grpcSpan := StartFromTraceparent(context.Background(), tr, a, "apiary.v1.JobService/SubmitJob") // no job attribute
	grpcSpan.End()
	placeSpan(tr, a, "eu-west-a", 1)
	placeSpan(tr, b, "eu-west-b", 1)
	// An agent's span of job a, shipped as a JSON line.
	sc := SpanContextOf(a)
	shipped := fmt.Sprintf(`{"trace_id":%q,"span_id":"00000000000000aa","name":"task.run","service":"apiary-agent","start":%q,"end":%q,"attributes":{"apiary.job.id":"eu-west-a"}}`,
		sc.TraceID().String(), time.Now().Format(time.RFC3339Nano), time.Now().Format(time.RFC3339Nano))
	if n := st.AddJSONLines([]byte(shipped + "\nnot json\n\n")); n != 1 {
		t.Fatalf("kept %d shipped spans, want 1 (the unparsable line skipped)", n)
	}
	got := lines(st.JobJSONLines("eu-west-a"))
	names := map[string]int{}
	for _, r := range got {
		if r.TraceID != sc.TraceID().String() {
			t.Errorf("span %s of another trace %s", r.Name, r.TraceID)
		}
		names[r.Name]++
	}
	if len(got) != 4 || names[SpanAccept] != 1 || names[SpanPlace] != 1 || names[SpanRun] != 1 || names["apiary.v1.JobService/SubmitJob"] != 1 {
		t.Fatalf("job a: %v, want accept, the gRPC span, place and the shipped run", names)
	}
	if got := st.JobJSONLines("eu-west-none"); len(got) != 0 {
		t.Errorf("unknown job: %s", got)
	}

	// Full: 6 spans held; 4 more push out the 2 oldest (the accepts of a and b).
	for i := 2; i <= 5; i++ {
		placeSpan(tr, b, "eu-west-b", i)
	}
	if st.Len() != 8 {
		t.Fatalf("len %d, want the cap 8", st.Len())
	}
	if got := lines(st.JobJSONLines("eu-west-a")); len(got) != 3 {
		t.Errorf("job a after 4 more spans: %d spans, want 3 (its accept dropped)", len(got))
	}
	if got := lines(st.JobJSONLines("eu-west-b")); len(got) != 5 {
		t.Errorf("job b: %d spans, want 5 (its accept dropped)", len(got))
	}
	// Age: an hour later nothing is returned.
	st.now = func() time.Time { return time.Now().Add(time.Hour + time.Second) }
	if got := st.JobJSONLines("eu-west-b"); len(got) != 0 {
		t.Errorf("spans older than the age bound returned: %s", got)
	}
}

// TestSetupBufferAndShip: Setup with a buffer and no exporter is enabled and
// buffers; with Ship it sends finished spans in batches; without either it
// stays a no-op.
func TestSetupBufferAndShip(t *testing.T) {
	env := func(string) string { return "" }
	p, err := Setup(context.Background(), Options{ServiceName: "apiary-region", Buffer: 100, Getenv: env})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Enabled || StoreOf(p) == nil || StoreOf(p).Cap() != 100 {
		t.Fatalf("buffer-only provider: enabled %v store %v", p.Enabled, StoreOf(p))
	}
	placeSpan(Tracer(p), rootOf(Tracer(p), "eu-west-x"), "eu-west-x", 1)
	if got := lines(StoreOf(p).JobJSONLines("eu-west-x")); len(got) != 2 || got[0].Service != "apiary-region" {
		t.Fatalf("buffered: %+v", got)
	}
	_ = p.Shutdown(context.Background())

	shippedc := make(chan []byte, 10)
	p, err = Setup(context.Background(), Options{ServiceName: "apiary-agent", Getenv: env,
		Ship: func(_ context.Context, b []byte) error { shippedc <- b; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if StoreOf(p) != nil {
		t.Fatal("ship-only provider has a buffer")
	}
	placeSpan(Tracer(p), rootOf(Tracer(p), "eu-west-y"), "eu-west-y", 1)
	select {
	case b := <-shippedc:
		if recs := lines(b); len(recs) != 2 || !strings.Contains(string(b), "eu-west-y") {
			t.Fatalf("shipped %s", b)
		}
	case <-time.After(ShipInterval + 5*time.Second):
		t.Fatal("nothing shipped")
	}
	_ = p.Shutdown(context.Background())

	p, err = Setup(context.Background(), Options{ServiceName: "apiary-cli", Getenv: env})
	if err != nil {
		t.Fatal(err)
	}
	if p.Enabled {
		t.Fatal("no buffer, no ship, no exporter: want the no-op provider")
	}
}

// TestSpanStoreMemory measures what one buffered lifecycle span costs, so
// that BufferSpanBytes (and the documented size of the default buffer)
// holds.
func TestSpanStoreMemory(t *testing.T) {
	const n = 5000
	st := NewSpanStore(n, time.Hour)
	tp := NewProvider("apiary-region", "c1", 0, false, sdktrace.WithSpanProcessor(st))
	tr := Tracer(tp)
	roots := make([]string, n/10)
	for i := range roots {
		roots[i] = Traceparent(trace.ContextWithSpanContext(context.Background(), SpanContextOf(rootOf(tr, "warm"))))
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < n; i++ {
		placeSpan(tr, roots[i%len(roots)], fmt.Sprintf("eu-west-%020d", i/10), i%10+1)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per buffered span (n=%d)", per, n)
	if per > BufferSpanBytes {
		t.Errorf("%.0f bytes per buffered span, more than BufferSpanBytes (%d): update it and the docs", per, BufferSpanBytes)
	}
	runtime.KeepAlive(st)
}

// BenchmarkBufferedSpan is the cost of one lifecycle span (start, 10
// attributes, end) recorded into the buffer, against the no-op provider.
func BenchmarkBufferedSpan(b *testing.B) {
	for _, mode := range []string{"noop", "buffer"} {
		b.Run(mode, func(b *testing.B) {
			var tp trace.TracerProvider = Noop()
			if mode == "buffer" {
				tp = NewProvider("apiary-region", "c1", 0, false, sdktrace.WithSpanProcessor(NewSpanStore(DefaultBufferSpans, 0)))
			}
			tr := Tracer(tp)
			parent := rootOf(Tracer(NewProvider("x", "", 0, false)), "warm")
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				placeSpan(tr, parent, "eu-west-00000000000000000001", 1)
			}
		})
	}
}
