package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/telemetry"
)

// telemetryFlags are the observability flags of the server roles (region,
// agent, global).
type telemetryFlags struct {
	metricsAddr string
	traceFile   string
	sampleRatio float64
	// buffer is --trace-buffer (region and global only): spans kept in
	// memory for `apiary trace`.
	buffer int
	// shipTo, if set (an agent's --addr), sends the process's finished spans
	// to those coordinators' span buffers (AgentService.ExportSpans).
	shipTo string
	// shipTLS and shipServerName are the agent's certificate and the name
	// its coordinators' certificates carry (nil: plaintext).
	shipTLS        *pki.Reloader
	shipServerName string
}

func (t *telemetryFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&t.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics (and /debug/pprof/) at ADDR, e.g. 127.0.0.1:9100 (empty: off)")
	f.StringVar(&t.traceFile, "trace-file", "", "append spans as JSON lines to this file (default $"+telemetry.EnvTraceFile+"; OTLP export is set by OTEL_EXPORTER_OTLP_ENDPOINT)")
	f.Float64Var(&t.sampleRatio, "trace-sample-ratio", 1, "fraction of new traces to keep, in (0, 1]; spans of a sampled job are always kept")
	// The processes that serve `apiary trace` (GetJobTrace) keep a buffer;
	// an agent sends its spans to its coordinators' buffers instead.
	if cmd.Name() == "region" || cmd.Name() == "global" {
		f.IntVar(&t.buffer, "trace-buffer", telemetry.DefaultBufferSpans, fmt.Sprintf(
			"keep the last N spans in memory (about %d bytes each) for \"apiary trace JOB_ID\"; 0: off", telemetry.BufferSpanBytes))
	}
}

// setup builds the tracer provider; the returned stop flushes it.
func (t *telemetryFlags) setup(service, instance string) (*telemetry.Provider, func(), error) {
	if t.sampleRatio <= 0 || t.sampleRatio > 1 {
		return nil, nil, fmt.Errorf("--trace-sample-ratio: must be in (0, 1], got %v", t.sampleRatio)
	}
	if t.buffer < 0 {
		return nil, nil, fmt.Errorf("--trace-buffer: must be >= 0 (0 turns the span buffer off), got %d", t.buffer)
	}
	opts := telemetry.Options{ServiceName: service, InstanceID: instance,
		File: t.traceFile, SampleRatio: t.sampleRatio, Buffer: t.buffer}
	var shipConn *grpc.ClientConn
	if t.shipTo != "" {
		cc, err := cliconn.DialTLS(t.shipTo, t.shipTLS, t.shipServerName)
		if err != nil {
			return nil, nil, fmt.Errorf("--addr: %w", err)
		}
		shipConn = cc
		client := apiaryv1.NewAgentServiceClient(cc)
		opts.Ship = func(ctx context.Context, spans []byte) error {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err := client.ExportSpans(ctx, &apiaryv1.ExportSpansRequest{NodeId: instance, SpansJsonl: spans})
			return err
		}
	}
	p, err := telemetry.Setup(context.Background(), opts)
	if err != nil {
		if shipConn != nil {
			shipConn.Close()
		}
		return nil, nil, err
	}
	return p, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "trace export:", err)
		}
		if shipConn != nil {
			shipConn.Close()
		}
	}, nil
}
