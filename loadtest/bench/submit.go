package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// SubmitOptions configures the submit benchmark.
type SubmitOptions struct {
	Coordinators int
	Clients      int // concurrent closed-loop clients (goroutines)
	Conns        int // gRPC connections they share (each round-robins over the coordinators)
	Warmup       time.Duration
	Duration     time.Duration
	// Tracing is how the region exports spans: TracingOff (default),
	// TracingFile or TracingOTLPGRPC.
	Tracing string
	// Run numbers repeated runs of the same configuration (names the
	// scratch directory only).
	Run int
}

// SubmitResult is one submit run.
type SubmitResult struct {
	Opts     SubmitOptions
	OK       int64 // successful submissions in the measured window
	Errors   int64 // failed submissions in the measured window
	PerSec   float64
	Latency  *hdrhistogram.Histogram // microseconds, measured window only
	Series   []int64                 // successes per second, warm-up included
	ErrCodes map[string]int64

	// Accepted counts every successful SubmitJob of the run (probes and
	// warm-up included, and answers that came after the window closed):
	// the jobs whose traces the region started.
	Accepted int64
	// Spans exported by the region (file lines, or spans the OTLP receiver
	// got), counted after the region was stopped (which flushes the
	// exporters), by span name; SpansAtEnd were there when the measured
	// window closed. OTLPRequests counts export calls.
	Spans        int64
	SpansAtEnd   int64
	SpansByName  map[string]int64
	OTLPRequests int64
	// SpanFileBytes is the size of the span file (file mode).
	SpanFileBytes int64
	// SpanSample is the first lines of the span file (file mode).
	SpanSample []string
	// CoordCPU is the CPU seconds of the coordinator processes (each with
	// its embedded etcd member) and HarnessCPU those of the harness (load
	// generator and, in otlp-grpc mode, the receiver), both from the start
	// of the warm-up to the end of the measured window.
	CoordCPU, HarnessCPU float64
}

// Submit runs closed-loop SubmitJob clients against a fresh region with no
// agents: each client sends a single-task job (with client_id and a unique
// request_id, as the CLI does) and sends the next when the answer arrives.
func Submit(ctx context.Context, cfg Config, o SubmitOptions) (SubmitResult, error) {
	res := SubmitResult{Opts: o, Latency: hdrhistogram.New(1, 60_000_000, 3), ErrCodes: map[string]int64{}}
	if o.Tracing == "" {
		o.Tracing = TracingOff
	}
	res.Opts = o
	dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("submit-%dm-%s-%d", o.Coordinators, o.Tracing, o.Run))
	sink, err := startTraceSink(o.Tracing, dir+"-trace")
	if err != nil {
		return res, err
	}
	defer sink.close()
	cl, r, err := startRegionEnv(ctx, cfg, dir, o.Coordinators, nil, nil, sink.env)
	if err != nil {
		return res, err
	}
	stopped := false
	defer func() {
		if !stopped {
			cl.Stop()
		}
	}()
	var coordPids []int
	for _, p := range r.Coords {
		coordPids = append(coordPids, p.Pid())
	}
	var accepted atomic.Int64
	conns, err := dialProbed(ctx, o.Conns, r.Dial)
	if err != nil {
		return res, err
	}
	defer closeAll(conns)
	accepted.Add(int64(len(conns)))
	total := o.Warmup + o.Duration
	series := make([]atomic.Int64, int(total/time.Second)+2)
	cpu0, self0 := cpuSeconds(coordPids...), selfCPU()
	start := time.Now()
	measureFrom, end := start.Add(o.Warmup), start.Add(total)
	lat, ok, bad, codes := closedLoop(ctx, conns, o.Clients, trueJob("submit", 1), "bench-submit",
		func(i, n int) string { return fmt.Sprintf("c%d-%d", i, n) }, measureFrom, end,
		func(_ *apiaryv1.SubmitJobResponse, err error, _, done time.Time) {
			if err != nil {
				return
			}
			accepted.Add(1)
			if sec := int(done.Sub(start) / time.Second); !done.After(end) && sec < len(series) {
				series[sec].Add(1)
			}
		})
	res.Latency.Merge(lat)
	for k, v := range codes {
		res.ErrCodes[k] += v
	}
	res.CoordCPU, res.HarnessCPU = cpuSeconds(coordPids...)-cpu0, (selfCPU() - self0).Seconds()
	res.OK, res.Errors = ok, bad
	res.Accepted = accepted.Load()
	if o.Tracing != TracingOff {
		if res.SpansAtEnd, _, _, err = sink.counts(); err != nil {
			return res, err
		}
		// Stopping the region (SIGTERM) flushes the batch span processors.
		for _, c := range conns {
			_ = c.Close()
		}
		cl.Stop()
		stopped = true
		if res.Spans, res.SpansByName, res.OTLPRequests, err = sink.counts(); err != nil {
			return res, err
		}
		if sink.file != "" {
			if fi, err := os.Stat(sink.file); err == nil {
				res.SpanFileBytes = fi.Size()
			}
			res.SpanSample = headLines(sink.file, 3)
		}
	}
	res.PerSec = float64(res.OK) / o.Duration.Seconds()
	for i := range series[:int(total/time.Second)] {
		res.Series = append(res.Series, series[i].Load())
	}
	return res, nil
}
