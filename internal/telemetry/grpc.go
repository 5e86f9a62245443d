package telemetry

import (
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/stats"
)

// TracedRPC reports whether an RPC gets otelgrpc spans: the JobService
// calls that change a job (SubmitJob, CancelJob). Reads and watches (polled
// by clients), agent heartbeats, reports and assignment streams do not: each
// would start a trace of its own. A job's later spans are made explicitly
// from its stored traceparent.
func TracedRPC(fullMethod string) bool {
	switch fullMethod {
	case "/apiary.v1.JobService/SubmitJob", "/apiary.v1.JobService/CancelJob":
		return true
	}
	return false
}

func filter(info *stats.RPCTagInfo) bool { return TracedRPC(info.FullMethodName) }

// GRPCServerHandler is the otelgrpc server stats handler for tp, or nil when
// tracing is off (pass it with grpc.StatsHandler only when non-nil).
func GRPCServerHandler(tp trace.TracerProvider) stats.Handler {
	if !IsEnabled(tp) {
		return nil
	}
	return otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(Propagator),
		otelgrpc.WithFilter(filter))
}

// GRPCClientHandler is the otelgrpc client stats handler for tp (nil: the
// global provider), or nil when tracing is off.
func GRPCClientHandler(tp trace.TracerProvider) stats.Handler {
	if tp == nil {
		tp = globalProvider()
	}
	if !IsEnabled(tp) {
		return nil
	}
	return otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(Propagator),
		otelgrpc.WithFilter(filter))
}
