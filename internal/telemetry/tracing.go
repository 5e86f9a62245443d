// Package telemetry is Apiary's observability plumbing, shared by every
// process: the OpenTelemetry tracer provider (OTLP gRPC/HTTP from the
// standard OTEL_* variables, a JSON-lines span file, sampling), W3C trace
// context helpers that let a span made anywhere, later, join the trace whose
// traceparent a job stored at submission, the Prometheus metrics of regions
// and agents with their /metrics server, and a slog handler that stamps
// trace and span ids on log lines.
//
// Tracing is off unless configured: Setup returns a no-op provider when
// no OTEL_* exporter variable, span file, span buffer or span shipping is
// set, so the instrumented paths cost one interface call per span. The
// server roles keep a span buffer by default (spanstore.go).
package telemetry

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TracerName is the instrumentation scope of every Apiary span.
const TracerName = "apiary.dev/apiary"

// EnvTraceFile names the variable that sets the span file when --trace-file
// is not given (apiary dev sets it for every process it starts).
const EnvTraceFile = "APIARY_TRACE_FILE"

// Attribute keys (OpenTelemetry semantic conventions where one exists, an
// apiary. prefix otherwise).
const (
	AttrJobID      = attribute.Key("apiary.job.id")
	AttrTaskIndex  = attribute.Key("apiary.task.index")
	AttrAttempt    = attribute.Key("apiary.attempt")
	AttrRegion     = attribute.Key("apiary.region")
	AttrNodeID     = attribute.Key("apiary.node.id")
	AttrShard      = attribute.Key("apiary.shard")
	AttrEpoch      = attribute.Key("apiary.epoch")
	AttrNodeEpoch  = attribute.Key("apiary.node.epoch")
	AttrScore      = attribute.Key("apiary.placement.score")
	AttrConflict   = attribute.Key("apiary.plan.conflict")
	AttrRequeued   = attribute.Key("apiary.plan.requeued")
	AttrOutcome    = attribute.Key("apiary.outcome")
	AttrTaskCount  = attribute.Key("apiary.job.tasks")
	AttrJobName    = attribute.Key("apiary.job.name")
	AttrToken      = attribute.Key("apiary.fencing_token")
	AttrReportKind = attribute.Key("apiary.report.kind")
	AttrOutputSize = attribute.Key("apiary.output.bytes")
	// AttrFetchBytes is a placement's input bytes the node did not hold
	// (the fetch hint: what running where the data is would have saved).
	AttrFetchBytes = attribute.Key("apiary.placement.fetch_bytes")
	AttrCoord      = attribute.Key("apiary.coordinator.id")
	AttrReason     = attribute.Key("apiary.reason")
	AttrLinkKind   = attribute.Key("apiary.link")
	// AttrFault is who was at fault for a failed attempt: "node" or
	// "job" (the agent's start-failure classification on task.run; the
	// region's AttemptResult.fault on its task spans, "unconfirmed" too).
	AttrFault = attribute.Key("apiary.failure.fault")
	// AttrCPUSeconds and AttrMemoryPeak are an attempt's usage from its
	// cgroup (task.run): CPU seconds of all its processes, and the most
	// memory charged at once, in bytes. Absent without a cgroup.
	AttrCPUSeconds = attribute.Key("apiary.usage.cpu_seconds")
	AttrMemoryPeak = attribute.Key("apiary.usage.memory_peak_bytes")
	// Semantic conventions.
	AttrProcessPID   = attribute.Key("process.pid")
	AttrExitCode     = attribute.Key("process.exit.code")
	AttrErrorType    = attribute.Key("error.type")
	AttrServiceName  = attribute.Key("service.name")
	AttrServiceInst  = attribute.Key("service.instance.id")
	AttrCommand      = attribute.Key("process.command")
	AttrDurationSecs = attribute.Key("apiary.duration_seconds")
)

// Span names of a job's lifecycle.
const (
	SpanSubmit   = "job.submit"
	SpanRoute    = "job.route"
	SpanAccept   = "job.accept"
	SpanPlace    = "task.place"
	SpanDispatch = "task.dispatch"
	SpanRun      = "task.run"
	SpanComplete = "task.complete"
	SpanFail     = "task.fail"
	SpanRetry    = "task.retry"
	SpanRefused  = "task.refused"
	SpanReclaim  = "task.reclaim"
	SpanCancel   = "task.cancel"
	// SpanAdopt: an attempt carried over to its node's new epoch (or
	// refused) after the agent came back (apiary.reason says why not).
	SpanAdopt = "task.adopt"
)

// Options configures Setup.
type Options struct {
	// ServiceName is the resource's service.name (apiary-region, apiary-agent,
	// apiary-cli, apiary-global).
	ServiceName string
	// InstanceID is service.instance.id (coordinator or node id).
	InstanceID string
	// File writes spans as JSON lines to this path (appending; several
	// processes may share one file). Empty: $APIARY_TRACE_FILE, if set.
	File string
	// SampleRatio, in (0, 1), samples that fraction of new traces (children
	// follow their parent). 0 or >= 1 keeps every trace, unless
	// OTEL_TRACES_SAMPLER says otherwise.
	SampleRatio float64
	// Sync exports each span as it ends (tests, short-lived CLI runs)
	// instead of batching.
	Sync bool
	// Buffer, if > 0, keeps the process's last Buffer finished spans in
	// memory (Provider.Store; about BufferSpanBytes each), for GetJobTrace.
	Buffer int
	// BufferAge is the longest a buffered span is kept (0: DefaultBufferAge).
	BufferAge time.Duration
	// Ship, if set, receives the process's finished spans in batches, every
	// ShipInterval, as JSON lines (the span-file format): an agent sends
	// them to its coordinator's buffer. An error drops the batch.
	Ship func(ctx context.Context, spansJSONL []byte) error
	// Getenv reads the environment (tests); default os.Getenv.
	Getenv func(string) string
}

// Provider is a configured tracer provider and its shutdown.
type Provider struct {
	trace.TracerProvider
	// Enabled is false for the no-op provider.
	Enabled bool
	// Store is the in-memory span buffer (nil unless Options.Buffer > 0).
	Store    *SpanStore
	shutdown func(context.Context) error
}

// Shutdown flushes and stops the exporters (a no-op when disabled).
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.shutdown == nil {
		return nil
	}
	return p.shutdown(ctx)
}

// Noop is the disabled provider.
func Noop() *Provider { return &Provider{TracerProvider: noop.NewTracerProvider()} }

var (
	setPropagator sync.Once
	global        atomic.Pointer[Provider]
)

// globalProvider is the provider of the last enabled Setup, else no-op.
func globalProvider() trace.TracerProvider {
	if p := global.Load(); p != nil {
		return p
	}
	return Noop()
}

// Propagator is the W3C trace context (and baggage) propagator Apiary uses
// on the wire and in stored records.
var Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Setup builds the process's tracer provider from opts and the standard
// OTEL_* variables, installs it (and the W3C propagator) as the global
// default, and returns it. OTLP export is on when OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, or OTEL_TRACES_EXPORTER names
// otlp; OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL picks grpc or http/protobuf
// (the default, as the specification says). The span file is on when
// opts.File or $APIARY_TRACE_FILE is set, the buffer when opts.Buffer > 0,
// shipping when opts.Ship is set. With none of them, the provider is a
// no-op. OTEL_SDK_DISABLED=true turns everything off.
func Setup(ctx context.Context, opts Options) (*Provider, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	setPropagator.Do(func() {
		otel.SetTextMapPropagator(Propagator)
		// OpenTelemetry's own errors (an exporter that cannot reach its
		// endpoint) go to the process's structured log, not to the
		// standard library's logger, which would break --log-format json.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			slog.Debug("tracing: export or SDK error", "err", err)
		}))
	})
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return Noop(), nil
	}
	var exporters []sdktrace.SpanExporter
	fail := func(err error) (*Provider, error) {
		for _, e := range exporters {
			_ = e.Shutdown(ctx)
		}
		return nil, err
	}
	file := opts.File
	if file == "" {
		file = getenv(EnvTraceFile)
	}
	if file != "" {
		fe, err := NewFileExporter(file)
		if err != nil {
			return fail(err)
		}
		exporters = append(exporters, fe)
	}
	if otlpWanted(getenv) {
		e, err := newOTLP(ctx, getenv)
		if err != nil {
			return fail(err)
		}
		exporters = append(exporters, e)
	}
	if len(exporters) == 0 && opts.Buffer <= 0 && opts.Ship == nil {
		return Noop(), nil
	}
	var popts []sdktrace.TracerProviderOption
	for _, e := range exporters {
		if opts.Sync {
			popts = append(popts, sdktrace.WithSyncer(e))
		} else {
			popts = append(popts, sdktrace.WithBatcher(e))
		}
	}
	var store *SpanStore
	if opts.Buffer > 0 {
		store = NewSpanStore(opts.Buffer, opts.BufferAge)
		popts = append(popts, sdktrace.WithSpanProcessor(store))
	}
	if opts.Ship != nil {
		if opts.Sync {
			popts = append(popts, sdktrace.WithSyncer(shipExporter{opts.Ship}))
		} else {
			popts = append(popts, sdktrace.WithBatcher(shipExporter{opts.Ship}, sdktrace.WithBatchTimeout(ShipInterval)))
		}
	}
	p := NewProvider(opts.ServiceName, opts.InstanceID, opts.SampleRatio, getenv("OTEL_TRACES_SAMPLER") != "", popts...)
	otel.SetTracerProvider(p)
	prov := &Provider{TracerProvider: p, Enabled: true, Store: store, shutdown: p.Shutdown}
	global.Store(prov)
	return prov, nil
}

// NewProvider returns an SDK tracer provider with Apiary's resource, ID
// generator (deterministic ids for task.run spans, so a later attempt can
// link to the one it replaces) and sampler, plus extra options (exporters).
// Tests use it with an in-memory exporter.
func NewProvider(service, instance string, ratio float64, samplerFromEnv bool, extra ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
	attrs := []attribute.KeyValue{AttrServiceName.String(service)}
	if instance != "" {
		attrs = append(attrs, AttrServiceInst.String(instance))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		res = resource.NewSchemaless(attrs...)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithIDGenerator(idGenerator{})}
	if !samplerFromEnv {
		s := sdktrace.ParentBased(sdktrace.AlwaysSample())
		if ratio > 0 && ratio < 1 {
			s = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))
		}
		opts = append(opts, sdktrace.WithSampler(s))
	}
	return sdktrace.NewTracerProvider(append(opts, extra...)...)
}

func otlpWanted(getenv func(string) string) bool {
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		return !strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "none")
	}
	return strings.Contains(strings.ToLower(getenv("OTEL_TRACES_EXPORTER")), "otlp")
}

// newOTLP builds the OTLP exporter; the exporters read the rest of the
// OTEL_EXPORTER_OTLP_* variables (endpoint, headers, insecure, timeout,
// compression) themselves.
func newOTLP(ctx context.Context, getenv func(string) string) (sdktrace.SpanExporter, error) {
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch strings.ToLower(proto) {
	case "grpc":
		e, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp grpc exporter: %w", err)
		}
		return e, nil
	case "", "http/protobuf", "http":
		e, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp http exporter: %w", err)
		}
		return e, nil
	}
	return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL: %q is not supported (grpc or http/protobuf)", proto)
}

// Tracer returns Apiary's tracer from tp (the global provider when nil).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(TracerName)
}

// Traceparent returns the W3C traceparent of the span in ctx, or "" if ctx
// has no valid span context.
func Traceparent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"]
}

// SpanTraceparent is the traceparent of span s.
func SpanTraceparent(s trace.Span) string {
	return Traceparent(trace.ContextWithSpan(context.Background(), s))
}

// ContextWithTraceparent returns ctx with the remote span context of the
// stored traceparent tp as parent; an empty or malformed tp leaves ctx as is.
func ContextWithTraceparent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}

// SpanContextOf parses a traceparent (an invalid span context if malformed).
func SpanContextOf(tp string) trace.SpanContext {
	return trace.SpanContextFromContext(ContextWithTraceparent(context.Background(), tp))
}

// StartFromTraceparent starts a span as a child of the stored traceparent tp
// (a root span when tp is empty), so that spans made later, on another
// process, after a failover or a restart, join the submission's trace.
func StartFromTraceparent(ctx context.Context, tr trace.Tracer, tp, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return tr.Start(ContextWithTraceparent(ctx, tp), name, opts...)
}

// RecordError marks span as failed with err (nil: nothing).
func RecordError(span trace.Span, err error) {
	if err == nil || !span.IsRecording() {
		return
	}
	span.RecordError(err)
	span.SetStatus(otelcodes.Error, err.Error())
}

// ---------------------------------------------------------------------------
// Attempt span ids: a task.run span's id is a hash of (job, task, attempt),
// so the place span of attempt n+1 (made by a scheduler that never saw the
// run of attempt n) can link to it.

type spanIDKey struct{}

// WithAttemptSpanID makes the next span started with ctx (by a provider from
// NewProvider) take the attempt's deterministic span id.
func WithAttemptSpanID(ctx context.Context, jobID string, task, attempt int32) context.Context {
	return context.WithValue(ctx, spanIDKey{}, AttemptSpanID(jobID, task, attempt))
}

// AttemptSpanID is the span id of the task.run span of (job, task, attempt).
func AttemptSpanID(jobID string, task, attempt int32) trace.SpanID {
	h := fnv.New64a()
	h.Write([]byte(jobID))
	var b [8]byte
	binary.BigEndian.PutUint32(b[:4], uint32(task))
	binary.BigEndian.PutUint32(b[4:], uint32(attempt))
	h.Write(b[:])
	var id trace.SpanID
	binary.BigEndian.PutUint64(id[:], h.Sum64()|1)
	return id
}

// AttemptLink links to the task.run span of an earlier attempt in the trace
// of traceparent tp (ok false when tp is unusable or attempt < 1).
func AttemptLink(tp, jobID string, task, attempt int32, kind string) (trace.Link, bool) {
	sc := SpanContextOf(tp)
	if !sc.IsValid() || attempt < 1 {
		return trace.Link{}, false
	}
	sc = sc.WithSpanID(AttemptSpanID(jobID, task, attempt)).WithRemote(true)
	return trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
		AttrLinkKind.String(kind), AttrAttempt.Int(int(attempt))}}, true
}

type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	var tid trace.TraceID
	for !tid.IsValid() {
		_, _ = rand.Read(tid[:])
	}
	return tid, idGenerator{}.NewSpanID(ctx, tid)
}

func (idGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if id, ok := ctx.Value(spanIDKey{}).(trace.SpanID); ok && id.IsValid() {
		return id
	}
	var sid trace.SpanID
	for !sid.IsValid() {
		_, _ = rand.Read(sid[:])
	}
	return sid
}

// OrNoop returns tp, or the no-op provider when tp is nil.
func OrNoop(tp trace.TracerProvider) trace.TracerProvider {
	if tp == nil {
		return noop.NewTracerProvider()
	}
	return tp
}

// IsEnabled reports whether tp records spans (nil, the no-op provider and a
// disabled *Provider do not).
func IsEnabled(tp trace.TracerProvider) bool {
	switch p := tp.(type) {
	case nil:
		return false
	case *Provider:
		return p != nil && p.Enabled
	case noop.TracerProvider, *noop.TracerProvider:
		return false
	}
	return true
}
