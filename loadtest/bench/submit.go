package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/grpc"

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
	if o.Conns <= 0 {
		o.Conns = 1
	}
	var conns []*grpc.ClientConn
	for i := 0; i < o.Conns; i++ {
		c, err := r.Dial()
		if err != nil {
			return res, err
		}
		defer c.Close()
		conns = append(conns, c)
	}
	// One probe submission so that every connection is up before timing.
	for _, c := range conns {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := apiaryv1.NewJobServiceClient(c).SubmitJob(pctx, &apiaryv1.SubmitJobRequest{Spec: trueJob("probe", 1)})
		cancel()
		if err != nil {
			return res, fmt.Errorf("probe: %w", err)
		}
		accepted.Add(1)
	}
	total := o.Warmup + o.Duration
	series := make([]atomic.Int64, int(total/time.Second)+2)
	cpu0, self0 := cpuSeconds(coordPids...), selfCPU()
	start := time.Now()
	measureFrom, end := start.Add(o.Warmup), start.Add(total)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var ok, bad atomic.Int64
	spec := trueJob("submit", 1)
	for i := 0; i < o.Clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			js := apiaryv1.NewJobServiceClient(conns[i%len(conns)])
			h := hdrhistogram.New(1, 60_000_000, 3)
			codes := map[string]int64{}
			for n := 0; ; n++ {
				t := time.Now()
				if !t.Before(end) || ctx.Err() != nil {
					break
				}
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := js.SubmitJob(cctx, &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: "bench-submit",
					RequestId: fmt.Sprintf("c%d-%d", i, n)})
				cancel()
				done := time.Now()
				if err == nil {
					accepted.Add(1)
				}
				if done.After(end) {
					break // the answer came after the window closed
				}
				if sec := int(done.Sub(start) / time.Second); err == nil && sec < len(series) {
					series[sec].Add(1)
				}
				if t.Before(measureFrom) {
					continue
				}
				if err != nil {
					bad.Add(1)
					codes[fmt.Sprint(grpcCode(err))]++
					continue
				}
				ok.Add(1)
				_ = h.RecordValue(done.Sub(t).Microseconds())
			}
			mu.Lock()
			res.Latency.Merge(h)
			for k, v := range codes {
				res.ErrCodes[k] += v
			}
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	res.CoordCPU, res.HarnessCPU = cpuSeconds(coordPids...)-cpu0, (selfCPU() - self0).Seconds()
	res.OK, res.Errors = ok.Load(), bad.Load()
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
