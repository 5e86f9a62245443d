package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// Tracing modes of the submit benchmark: how the region's processes export
// spans. The benchmark's clients send no traceparent, so with tracing on the
// region starts each job's trace at accept (an otelgrpc server span for
// SubmitJob and its job.accept child).
const (
	// TracingOff starts the region with OTEL_SDK_DISABLED=true: no exporter,
	// no in-memory span buffer, no span shipping (no-op provider).
	TracingOff = "off"
	// TracingFile sets APIARY_TRACE_FILE=<dir>/spans.jsonl (JSON-lines file
	// exporter, batched).
	TracingFile = "file"
	// TracingOTLPGRPC sets OTEL_EXPORTER_OTLP_ENDPOINT to an OTLP/gRPC trace
	// receiver the harness runs in-process (it counts what arrives).
	TracingOTLPGRPC = "otlp-grpc"
)

// TracingModes are the valid values of SubmitOptions.Tracing.
var TracingModes = []string{TracingOff, TracingFile, TracingOTLPGRPC}

// traceSink is where a region under test sends its spans, and how the
// harness counts them.
type traceSink struct {
	mode string
	env  []string
	file string
	lis  net.Listener
	srv  *grpc.Server
	rcv  *otlpReceiver
}

func startTraceSink(mode, dir string) (*traceSink, error) {
	t := &traceSink{mode: mode}
	switch mode {
	case "", TracingOff:
		t.mode = TracingOff
		// Coordinators and routers buffer spans by default (GetJobTrace):
		// "off" means none of it.
		t.env = []string{"OTEL_SDK_DISABLED=true"}
	case TracingFile:
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		t.file = filepath.Join(dir, "spans.jsonl")
		_ = os.Remove(t.file)
		t.env = []string{"APIARY_TRACE_FILE=" + t.file}
	case TracingOTLPGRPC:
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		t.lis, t.srv, t.rcv = lis, grpc.NewServer(grpc.MaxRecvMsgSize(64<<20)), &otlpReceiver{names: map[string]int64{}}
		collectortrace.RegisterTraceServiceServer(t.srv, t.rcv)
		go func() { _ = t.srv.Serve(lis) }()
		t.env = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + lis.Addr().String(),
			"OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "OTEL_EXPORTER_OTLP_INSECURE=true"}
	default:
		return nil, fmt.Errorf("tracing mode %q: want one of %s", mode, strings.Join(TracingModes, ", "))
	}
	// Blank whatever the harness's own environment might carry, so only the
	// mode's variables are in effect (an empty variable counts as unset;
	// later entries win in exec).
	t.env = append([]string{"APIARY_TRACE_FILE=", "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=",
		"OTEL_TRACES_EXPORTER=", "OTEL_EXPORTER_OTLP_PROTOCOL=", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=", "OTEL_SDK_DISABLED="}, t.env...)
	return t, nil
}

// counts returns the spans exported so far, by name, and the OTLP export
// requests (0 for the file).
func (t *traceSink) counts() (total int64, byName map[string]int64, requests int64, err error) {
	switch t.mode {
	case TracingFile:
		return countSpanFile(t.file)
	case TracingOTLPGRPC:
		total, byName, requests = t.rcv.snapshot()
		return total, byName, requests, nil
	}
	return 0, nil, 0, nil
}

func (t *traceSink) close() {
	if t.srv != nil {
		t.srv.Stop()
	}
}

// otlpReceiver is an OTLP collector TraceService that counts the spans it
// receives (by name) and discards them.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	spans, requests atomic.Int64
	mu              sync.Mutex
	names           map[string]int64
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	var n int64
	local := map[string]int64{}
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				local[s.GetName()]++
				n++
			}
		}
	}
	r.mu.Lock()
	for k, v := range local {
		r.names[k] += v
	}
	r.mu.Unlock()
	r.spans.Add(n)
	r.requests.Add(1)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *otlpReceiver) snapshot() (int64, map[string]int64, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[string]int64, len(r.names))
	for k, v := range r.names {
		m[k] = v
	}
	return r.spans.Load(), m, r.requests.Load()
}

// countSpanFile counts the JSON lines of a span file, by span name.
func countSpanFile(path string) (int64, map[string]int64, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return 0, map[string]int64{}, 0, nil
		}
		return 0, nil, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	names := map[string]int64{}
	var n int64
	for sc.Scan() {
		var rec struct {
			Name string `json:"name"`
		}
		if len(sc.Bytes()) == 0 {
			continue
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			names["(unparsable)"]++
		} else {
			names[rec.Name]++
		}
		n++
	}
	return n, names, 0, sc.Err()
}

// FormatCounts renders span counts by name, sorted by name.
func FormatCounts(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

// selfCPU is the harness process's own user+system CPU time (load
// generator and, in otlp-grpc mode, the receiver).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// headLines returns up to n first lines of the file at path.
func headLines(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var out []string
	for len(out) < n && sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}
