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

// submitted ends a job's accept span as the child of a SubmitJob server
// span without the job attribute (as otelgrpc makes it), the server span a
// child of parent (a traceparent; "" starts a trace), and returns the
// accept span's traceparent.
func submitted(tr trace.Tracer, parent, job string) string {
	sctx, server := StartFromTraceparent(context.Background(), tr, parent, "apiary.v1.JobService/SubmitJob",
		trace.WithSpanKind(trace.SpanKindServer))
	actx, accept := tr.Start(sctx, SpanAccept, trace.WithAttributes(AttrJobID.String(job)))
	accept.End()
	server.End()
	return Traceparent(actx)
}

func lines(b []byte) []SpanRecord {
	recs, _ := ReadSpans(bytes.NewReader(b))
	return recs
}

// TestSpanStoreJobTraces: a job's query returns its spans (also the
// SubmitJob server span above its accept span, which has no job attribute,
// and spans shipped by another process), nothing of other jobs; the oldest
// spans go first when full; spans older than the age bound are not
// returned.
func TestSpanStoreJobTraces(t *testing.T) {
	st := NewSpanStore(8, time.Hour)
	tp := NewProvider("apiary-region", "c1", 0, false, sdktrace.WithSpanProcessor(st))
	tr := Tracer(tp)
	a := submitted(tr, "", "eu-west-a")
	b := rootOf(tr, "eu-west-b")
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

	// Full: 6 spans held; 4 more push out the 2 oldest (a's accept and
	// SubmitJob spans).
	for i := 2; i <= 5; i++ {
		placeSpan(tr, b, "eu-west-b", i)
	}
	if st.Len() != 8 {
		t.Fatalf("len %d, want the cap 8", st.Len())
	}
	if got := lines(st.JobJSONLines("eu-west-a")); len(got) != 2 {
		t.Errorf("job a after 4 more spans: %d spans, want 2 (its accept and SubmitJob spans dropped)", len(got))
	}
	if got := lines(st.JobJSONLines("eu-west-b")); len(got) != 6 {
		t.Errorf("job b: %d spans, want 6 (its accept and 5 places)", len(got))
	}
	// Age: an hour later nothing is returned.
	st.now = func() time.Time { return time.Now().Add(time.Hour + time.Second) }
	if got := st.JobJSONLines("eu-west-b"); len(got) != 0 {
		t.Errorf("spans older than the age bound returned: %s", got)
	}
}

// TestSpanStoreTraceInjection: jobs submitted with another job's
// traceparent (SubmitJobRequest.traceparent is the client's to set) share
// its trace id; the victim's query returns only its own spans and the
// attribute-less spans of its own submission, as a router's and a
// region's buffers hold them.
func TestSpanStoreTraceInjection(t *testing.T) {
	st := NewSpanStore(100, time.Hour)
	tr := Tracer(NewProvider("apiary-global", "g1", 0, false, sdktrace.WithSpanProcessor(st)))
	start := func(parent context.Context, name string, kind trace.SpanKind, job string) (context.Context, trace.Span) {
		var opts []trace.SpanStartOption
		if job != "" {
			opts = append(opts, trace.WithAttributes(AttrJobID.String(job)))
		}
		return tr.Start(parent, name, append(opts, trace.WithSpanKind(kind))...)
	}
	id := func(s trace.Span) string { return s.SpanContext().SpanID().String() }
	want := map[string]string{} // span id -> what it is, for the victim
	bad := map[string]string{}  // span id -> what it is, not the victim's
	end := func(into map[string]string, what string, s trace.Span) { into[id(s)] = what; s.End() }
	const victim, intruder = "eu-west-victim", "eu-west-intruder"

	// Router: the victim's otelgrpc server span, job.route, and its
	// forwarded SubmitJob (a client span).
	rctx, rServer := start(context.Background(), "apiary.v1.JobService/SubmitJob", trace.SpanKindServer, "")
	routeCtx, route := start(rctx, SpanRoute, trace.SpanKindServer, victim)
	_, fwd := start(routeCtx, "apiary.v1.JobService/SubmitJob", trace.SpanKindClient, "")
	end(want, "router forward", fwd)
	end(want, "route", route)
	end(want, "router server span", rServer)
	victimTP := Traceparent(routeCtx) // what the region stores for the victim
	// Intruders with the victim's traceparent (and gRPC metadata naming its
	// route span): an accepted job and a refused one, each with its own
	// forwarded call.
	for _, job := range []string{intruder, ""} {
		ictx := ContextWithTraceparent(context.Background(), victimTP)
		_, iServer := start(ictx, "apiary.v1.JobService/SubmitJob", trace.SpanKindServer, "")
		irCtx, iRoute := start(ictx, SpanRoute, trace.SpanKindServer, job)
		_, iFwd := start(irCtx, "apiary.v1.JobService/SubmitJob", trace.SpanKindClient, "")
		end(bad, "intruder "+job+" router forward", iFwd)
		end(bad, "intruder "+job+" route", iRoute)
		end(bad, "intruder "+job+" router server span", iServer)
	}

	// Region: the victim's server span and accept, then its lifecycle.
	gctx, gServer := start(ContextWithTraceparent(context.Background(), victimTP), "apiary.v1.JobService/SubmitJob", trace.SpanKindServer, "")
	actx, accept := start(gctx, SpanAccept, trace.SpanKindInternal, victim)
	end(want, "accept", accept)
	end(want, "region server span", gServer)
	_, place := start(ContextWithTraceparent(context.Background(), victimTP), SpanPlace, trace.SpanKindInternal, victim)
	end(want, "place", place)
	// The intruders at the region: metadata naming the victim's accept span.
	for _, job := range []string{intruder, ""} {
		_, iServer := start(actx, "apiary.v1.JobService/SubmitJob", trace.SpanKindServer, "")
		iaCtx, iAccept := start(trace.ContextWithSpan(context.Background(), iServer), SpanAccept, trace.SpanKindInternal, job)
		end(bad, "intruder "+job+" accept", iAccept)
		end(bad, "intruder "+job+" region server span", iServer)
		if job != "" {
			_, iPlace := start(ContextWithTraceparent(context.Background(), victimTP), SpanPlace, trace.SpanKindInternal, job)
			end(bad, "intruder place", iPlace)
			_, iChild := start(iaCtx, "child of the intruder's accept", trace.SpanKindClient, "")
			end(bad, "intruder client span", iChild)
		}
	}

	got := map[string]string{}
	for _, r := range lines(st.JobJSONLines(victim)) {
		got[r.SpanID] = r.Name
		if r.TraceID != accept.SpanContext().TraceID().String() {
			t.Errorf("span %s of trace %s, want the victim's", r.Name, r.TraceID)
		}
	}
	for sid, what := range want {
		if got[sid] == "" {
			t.Errorf("victim's trace lacks its %s", what)
		}
	}
	for sid, what := range bad {
		if got[sid] != "" {
			t.Errorf("victim's trace holds the %s", what)
		}
	}
	if len(got) != len(want) {
		t.Errorf("victim's trace: %d spans, want %d", len(got), len(want))
	}
	// The intruder's own query: its route, forward, region server span (the
	// parent of its accept), accept and place, none of the victim's (its
	// router server span is a sibling of its route, so it is left out).
	n := 0
	for _, r := range lines(st.JobJSONLines(intruder)) {
		n++
		if want[r.SpanID] != "" {
			t.Errorf("intruder's trace holds the victim's %s", want[r.SpanID])
		}
	}
	if n != 5 {
		t.Errorf("intruder's trace: %d spans, want 5 (route, forward, region server span, accept, place)", n)
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
