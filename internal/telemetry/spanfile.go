package telemetry

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// SpanRecord is one line of a span file: a finished span, self-contained
// (the service is copied from the resource). The format is Apiary's own,
// small and stable; `apiary trace` reads it.
type SpanRecord struct {
	TraceID      string         `json:"trace_id"`
	SpanID       string         `json:"span_id"`
	ParentSpanID string         `json:"parent_span_id,omitempty"`
	Name         string         `json:"name"`
	Kind         string         `json:"kind,omitempty"`
	Service      string         `json:"service,omitempty"`
	Instance     string         `json:"instance,omitempty"`
	Start        time.Time      `json:"start"`
	End          time.Time      `json:"end"`
	StatusCode   string         `json:"status,omitempty"` // "error" or "ok"; empty: unset
	StatusMsg    string         `json:"status_message,omitempty"`
	Attributes   map[string]any `json:"attributes,omitempty"`
	Events       []EventRecord  `json:"events,omitempty"`
	Links        []LinkRecord   `json:"links,omitempty"`
}

// EventRecord is a span event.
type EventRecord struct {
	Name       string         `json:"name"`
	Time       time.Time      `json:"time"`
	Attributes map[string]any `json:"attributes,omitempty"`
}

// LinkRecord is a span link.
type LinkRecord struct {
	TraceID    string         `json:"trace_id"`
	SpanID     string         `json:"span_id"`
	Attributes map[string]any `json:"attributes,omitempty"`
}

// Attr returns attribute k as a string ("" if absent).
func (r *SpanRecord) Attr(k attribute.Key) string {
	v, ok := r.Attributes[string(k)]
	if !ok {
		return ""
	}
	switch x := v.(type) {
	case string:
		return x
	case float64:
		if x == float64(int64(x)) {
			return fmt.Sprint(int64(x))
		}
		return strconv.FormatFloat(x, 'g', 4, 64)
	default:
		return fmt.Sprint(x)
	}
}

// FileExporter writes finished spans as JSON lines. Each batch is one
// write(2) on an O_APPEND file, so several processes can share a file.
type FileExporter struct {
	mu sync.Mutex
	f  *os.File
}

// NewFileExporter opens (creating, appending) path.
func NewFileExporter(path string) (*FileExporter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("trace file: %w", err)
	}
	return &FileExporter{f: f}, nil
}

// ExportSpans implements sdktrace.SpanExporter.
func (e *FileExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, s := range spans {
		if err := enc.Encode(Record(s)); err != nil {
			return err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.f == nil {
		return nil
	}
	_, err := e.f.Write(buf.Bytes())
	return err
}

// Shutdown implements sdktrace.SpanExporter.
func (e *FileExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.f == nil {
		return nil
	}
	err := e.f.Close()
	e.f = nil
	return err
}

// Record converts a finished span.
func Record(s sdktrace.ReadOnlySpan) SpanRecord {
	r := SpanRecord{
		TraceID: s.SpanContext().TraceID().String(),
		SpanID:  s.SpanContext().SpanID().String(),
		Name:    s.Name(),
		Kind:    s.SpanKind().String(),
		Start:   s.StartTime(),
		End:     s.EndTime(),
	}
	if p := s.Parent(); p.IsValid() {
		r.ParentSpanID = p.SpanID().String()
	}
	if res := s.Resource(); res != nil {
		if v, ok := res.Set().Value(AttrServiceName); ok {
			r.Service = v.AsString()
		}
		if v, ok := res.Set().Value(AttrServiceInst); ok {
			r.Instance = v.AsString()
		}
	}
	switch s.Status().Code {
	case otelcodes.Error:
		r.StatusCode, r.StatusMsg = "error", s.Status().Description
	case otelcodes.Ok:
		r.StatusCode = "ok"
	}
	r.Attributes = attrMap(s.Attributes())
	for _, ev := range s.Events() {
		r.Events = append(r.Events, EventRecord{Name: ev.Name, Time: ev.Time, Attributes: attrMap(ev.Attributes)})
	}
	for _, l := range s.Links() {
		r.Links = append(r.Links, LinkRecord{TraceID: l.SpanContext.TraceID().String(),
			SpanID: l.SpanContext.SpanID().String(), Attributes: attrMap(l.Attributes)})
	}
	return r
}

func attrMap(kvs []attribute.KeyValue) map[string]any {
	if len(kvs) == 0 {
		return nil
	}
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// ReadSpans reads a span file; lines that do not parse (a torn last line of
// a process that was killed mid-write) are skipped.
func ReadSpans(r io.Reader) ([]SpanRecord, error) {
	var out []SpanRecord
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var rec SpanRecord
		if json.Unmarshal(line, &rec) != nil {
			continue
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

// ReadSpanFile reads a span file by path.
func ReadSpanFile(path string) ([]SpanRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadSpans(f)
}
