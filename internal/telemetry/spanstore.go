package telemetry

// The in-memory span buffer behind `apiary trace JOB_ID --addr`: every
// coordinator and router keeps its most recent finished spans (and a
// coordinator also its agents' spans, which they ship to it), so a job's
// trace can be read over the API with no span file or collector.

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// DefaultBufferSpans is the span buffer size of `apiary region` and `apiary
// global` (--trace-buffer): the most recent spans each keeps in memory for
// `apiary trace`. BufferSpanBytes bounds the heap one buffered lifecycle
// span holds (TestSpanStoreMemory measured about 1.1 KB for a task.place
// span), so the default buffer holds about 11 MB, 20 MB at most.
const (
	DefaultBufferSpans = 10000
	BufferSpanBytes    = 2048
)

// DefaultBufferAge is how long a buffered span is kept at most: a job's
// trace does not outlive its record (the default --job-retention).
const DefaultBufferAge = 24 * time.Hour

// ShipInterval is how often an agent sends its finished spans to its
// coordinator's buffer (Options.Ship): a task.run span reaches the buffer
// at most about this long (plus one RPC) after the attempt ends.
const ShipInterval = time.Second

// FileBatchInterval is how often the span file and OTLP exporters write
// their batches (the OpenTelemetry SDK default, which OTEL_BSP_SCHEDULE_DELAY
// changes): the last spans of a job reach a span file about this long after
// they end.
const FileBatchInterval = 5 * time.Second

// SpanStore keeps the most recent finished spans in memory, at most max
// spans (the oldest are dropped first) and none older than maxAge (by end
// time). It is an sdktrace.SpanProcessor for the process's own spans and
// takes spans shipped by other processes with AddJSONLines. Safe for
// concurrent use; the cost per span is one mutex and one slot write (the
// JSON encoding is done when a trace is read).
type SpanStore struct {
	maxAge time.Duration
	now    func() time.Time

	mu    sync.Mutex
	ring  []storedSpan
	next  int // slot of the next span
	count int
}

type storedSpan struct {
	trace  trace.TraceID
	span   trace.SpanID
	parent trace.SpanID // zero: a root span
	job    string       // the AttrJobID attribute ("" when it has none)
	name   string
	client bool // trace.SpanKindClient
	end    time.Time
	ro     sdktrace.ReadOnlySpan // a span of this process, or
	raw    []byte                // a shipped span, as one JSON line
}

// NewSpanStore returns a buffer of max spans (max >= 1) kept at most maxAge
// (0: DefaultBufferAge).
func NewSpanStore(max int, maxAge time.Duration) *SpanStore {
	if max < 1 {
		max = 1
	}
	if maxAge <= 0 {
		maxAge = DefaultBufferAge
	}
	return &SpanStore{maxAge: maxAge, now: time.Now, ring: make([]storedSpan, max)}
}

// Cap is the most spans the buffer holds.
func (s *SpanStore) Cap() int { return len(s.ring) }

// Len is the number of spans held (expired ones included until overwritten).
func (s *SpanStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

func (s *SpanStore) put(e storedSpan) {
	s.mu.Lock()
	s.ring[s.next] = e
	s.next = (s.next + 1) % len(s.ring)
	if s.count < len(s.ring) {
		s.count++
	}
	s.mu.Unlock()
}

// OnStart implements sdktrace.SpanProcessor (nothing to do).
func (s *SpanStore) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd implements sdktrace.SpanProcessor: it keeps the finished span.
func (s *SpanStore) OnEnd(ro sdktrace.ReadOnlySpan) {
	if !ro.SpanContext().IsSampled() {
		return
	}
	e := storedSpan{trace: ro.SpanContext().TraceID(), span: ro.SpanContext().SpanID(), parent: ro.Parent().SpanID(),
		name: ro.Name(), client: ro.SpanKind() == trace.SpanKindClient, end: ro.EndTime(), ro: ro}
	for _, kv := range ro.Attributes() {
		if kv.Key == AttrJobID {
			e.job = kv.Value.AsString()
			break
		}
	}
	s.put(e)
}

// Shutdown implements sdktrace.SpanProcessor (the buffer stays readable).
func (s *SpanStore) Shutdown(context.Context) error { return nil }

// ForceFlush implements sdktrace.SpanProcessor (nothing is pending).
func (s *SpanStore) ForceFlush(context.Context) error { return nil }

// AddJSONLines keeps spans shipped by another process, one SpanRecord per
// line (the span-file format), and returns how many it kept; lines that do
// not parse or lack a valid trace id are skipped.
func (s *SpanStore) AddJSONLines(b []byte) int {
	n := 0
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var r struct {
			TraceID    string         `json:"trace_id"`
			SpanID     string         `json:"span_id"`
			ParentID   string         `json:"parent_span_id"`
			Name       string         `json:"name"`
			Kind       string         `json:"kind"`
			End        time.Time      `json:"end"`
			Attributes map[string]any `json:"attributes"`
		}
		if json.Unmarshal(line, &r) != nil {
			continue
		}
		tid, err := trace.TraceIDFromHex(r.TraceID)
		if err != nil {
			continue
		}
		// A malformed span or parent id is kept as zero: the span is then
		// nobody's parent, and a root.
		sid, _ := trace.SpanIDFromHex(r.SpanID)
		pid, _ := trace.SpanIDFromHex(r.ParentID)
		job, _ := r.Attributes[string(AttrJobID)].(string)
		s.put(storedSpan{trace: tid, span: sid, parent: pid, job: job, name: r.Name,
			client: r.Kind == trace.SpanKindClient.String(), end: r.End, raw: bytes.Clone(line)})
		n++
	}
	return n
}

// JobJSONLines returns the buffered spans of job jobID, one JSON
// SpanRecord per line, oldest first: the spans whose AttrJobID attribute is
// jobID, and of the spans without that attribute only those that belong to
// the job's submission:
//
//   - the ancestors of its job.accept and job.route spans (SpanAccept,
//     SpanRoute) through spans without the attribute: the otelgrpc server
//     span of the SubmitJob call that made them (region or router);
//   - the client spans whose parent is its job.route span: the router's
//     forwarded SubmitJob calls.
//
// Other spans of the same trace are left out, so a job submitted with
// another job's traceparent (SubmitJobRequest.traceparent is the client's
// to set) does not show in that job's trace, nor that job in its own: the
// trace id says which trace a span joins, the attribute which job it is
// of. A span without the attribute that is the parent of neither (e.g. the
// router's otelgrpc server span when the client sent a traceparent, which
// makes job.route a child of the client's span instead) is left out too.
// Cost: O(buffered spans) under the buffer's mutex, plus a map of the
// attribute-less spans of the job's traces.
func (s *SpanStore) JobJSONLines(jobID string) []byte {
	if jobID == "" {
		return nil
	}
	type spanKey struct {
		trace trace.TraceID
		span  trace.SpanID
	}
	s.mu.Lock()
	cutoff := s.now().Add(-s.maxAge)
	live := func(e *storedSpan) bool { return e.end.After(cutoff) }
	traces := map[trace.TraceID]bool{}
	s.each(func(e *storedSpan) {
		if e.job == jobID && live(e) {
			traces[e.trace] = true
		}
	})
	var picked []storedSpan
	if len(traces) > 0 {
		// The attribute-less spans of the job's traces, by id.
		anon := map[spanKey]*storedSpan{}
		s.each(func(e *storedSpan) {
			if e.job == "" && traces[e.trace] && live(e) && e.span.IsValid() {
				anon[spanKey{e.trace, e.span}] = e
			}
		})
		keep := map[*storedSpan]bool{}
		routes := map[spanKey]bool{}
		s.each(func(e *storedSpan) {
			if e.job != jobID || !live(e) {
				return
			}
			keep[e] = true
			if e.name != SpanAccept && e.name != SpanRoute {
				return
			}
			if e.name == SpanRoute && e.span.IsValid() {
				routes[spanKey{e.trace, e.span}] = true
			}
			for p := anon[spanKey{e.trace, e.parent}]; p != nil && !keep[p]; p = anon[spanKey{p.trace, p.parent}] {
				keep[p] = true
			}
		})
		s.each(func(e *storedSpan) {
			if keep[e] || (e.job == "" && e.client && live(e) && routes[spanKey{e.trace, e.parent}]) {
				picked = append(picked, *e)
			}
		})
	}
	s.mu.Unlock()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, e := range picked {
		if e.raw != nil {
			buf.Write(e.raw)
			buf.WriteByte('\n')
			continue
		}
		_ = enc.Encode(Record(e.ro))
	}
	return buf.Bytes()
}

// each calls f on every held span, oldest first; s.mu is held.
func (s *SpanStore) each(f func(*storedSpan)) {
	start := s.next - s.count
	if start < 0 {
		start += len(s.ring)
	}
	for i := 0; i < s.count; i++ {
		f(&s.ring[(start+i)%len(s.ring)])
	}
}

// StoreOf returns the span buffer of tp (a *Provider from Setup with
// Options.Buffer set), or nil.
func StoreOf(tp trace.TracerProvider) *SpanStore {
	if p, ok := tp.(*Provider); ok && p != nil {
		return p.Store
	}
	return nil
}

// shipExporter sends batches of finished spans to Options.Ship.
type shipExporter struct {
	ship func(ctx context.Context, spansJSONL []byte) error
}

func (e shipExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, s := range spans {
		if err := enc.Encode(Record(s)); err != nil {
			return err
		}
	}
	return e.ship(ctx, buf.Bytes())
}

func (shipExporter) Shutdown(context.Context) error { return nil }
