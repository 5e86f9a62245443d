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
	trace trace.TraceID
	job   string
	end   time.Time
	ro    sdktrace.ReadOnlySpan // a span of this process, or
	raw   []byte                // a shipped span, as one JSON line
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
	e := storedSpan{trace: ro.SpanContext().TraceID(), end: ro.EndTime(), ro: ro}
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
		job, _ := r.Attributes[string(AttrJobID)].(string)
		s.put(storedSpan{trace: tid, job: job, end: r.End, raw: bytes.Clone(line)})
		n++
	}
	return n
}

// JobJSONLines returns every buffered span of each trace that holds a span
// of job jobID (the job's spans and their parents, e.g. the gRPC server
// span of its submission), one JSON SpanRecord per line, oldest first.
func (s *SpanStore) JobJSONLines(jobID string) []byte {
	if jobID == "" {
		return nil
	}
	s.mu.Lock()
	cutoff := s.now().Add(-s.maxAge)
	traces := map[trace.TraceID]bool{}
	s.each(func(e *storedSpan) {
		if e.job == jobID && e.end.After(cutoff) {
			traces[e.trace] = true
		}
	})
	var picked []storedSpan
	if len(traces) > 0 {
		s.each(func(e *storedSpan) {
			if traces[e.trace] && e.end.After(cutoff) {
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
