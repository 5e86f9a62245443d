package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"apiary.dev/apiary/internal/telemetry"
)

// telemetryFlags are the observability flags of the server roles (region,
// agent, global).
type telemetryFlags struct {
	metricsAddr string
	traceFile   string
	sampleRatio float64
}

func (t *telemetryFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&t.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics (and /debug/pprof/) at ADDR, e.g. 127.0.0.1:9100 (empty: off)")
	f.StringVar(&t.traceFile, "trace-file", "", "append spans as JSON lines to this file (default $"+telemetry.EnvTraceFile+"; OTLP export is set by OTEL_EXPORTER_OTLP_ENDPOINT)")
	f.Float64Var(&t.sampleRatio, "trace-sample-ratio", 1, "fraction of new traces to keep, in (0, 1]; spans of a sampled job are always kept")
}

// setup builds the tracer provider; the returned stop flushes it.
func (t *telemetryFlags) setup(service, instance string) (*telemetry.Provider, func(), error) {
	if t.sampleRatio <= 0 || t.sampleRatio > 1 {
		return nil, nil, fmt.Errorf("--trace-sample-ratio: must be in (0, 1], got %v", t.sampleRatio)
	}
	p, err := telemetry.Setup(context.Background(), telemetry.Options{ServiceName: service, InstanceID: instance,
		File: t.traceFile, SampleRatio: t.sampleRatio})
	if err != nil {
		return nil, nil, err
	}
	return p, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "trace export:", err)
		}
	}, nil
}
