package agent

// The agent's part of a job's trace (one task.run span per attempt, a child
// of the assignment's traceparent, with the attempt's deterministic span id
// so a later attempt can link to it) and its metrics.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/telemetry"
)

// newAgentMetrics registers the agent's metrics; running attempts and free
// capacity are read from the ledger at scrape time.
func newAgentMetrics(c Config, ledger *Ledger) *telemetry.AgentMetrics {
	capacity := map[string]float64{"cpu_millis": float64(c.Capacity.CPUMillis),
		"memory_mb": float64(c.Capacity.MemoryMB), "gpus": float64(c.Capacity.GPUs)}
	return telemetry.NewAgentMetrics(c.Registry,
		func() float64 { _, n := ledger.Used(); return float64(n) },
		func() map[string]float64 {
			u, _ := ledger.Used()
			return map[string]float64{"cpu_millis": float64(c.Capacity.CPUMillis - u.CPUMillis),
				"memory_mb": float64(c.Capacity.MemoryMB - u.MemoryMB), "gpus": float64(c.Capacity.GPUs - u.GPUs)}
		}, capacity)
}

// startRun starts the attempt's task.run span.
func (a *Agent) startRun(ctx context.Context, sess *session, asg *apiaryv1.Assignment, region string) (context.Context, trace.Span) {
	if !a.tracing {
		return ctx, trace.SpanFromContext(context.Background())
	}
	pctx := telemetry.WithAttemptSpanID(telemetry.ContextWithTraceparent(ctx, asg.GetTraceparent()),
		asg.GetJobId(), asg.GetTaskIndex(), asg.GetAttempt())
	return a.tracer.Start(pctx, telemetry.SpanRun, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		telemetry.AttrJobID.String(asg.GetJobId()), telemetry.AttrTaskIndex.Int(int(asg.GetTaskIndex())),
		telemetry.AttrAttempt.Int(int(asg.GetAttempt())), telemetry.AttrRegion.String(region),
		telemetry.AttrNodeID.String(a.cfg.NodeID), telemetry.AttrNodeEpoch.Int64(sess.epoch),
		telemetry.AttrToken.Int64(asg.GetFencingToken()), telemetry.AttrCommand.String(asg.GetCommand())))
}

// endRun ends the run span and counts the attempt: startErr when the
// process could not start, else its result.
func (a *Agent) endRun(span trace.Span, startErr error, exec Running, res *Result, dir string) {
	outcome := "start_failed"
	if startErr == nil {
		d := res.Ended.Sub(res.Started)
		a.metrics.AttemptDuration.Observe(d.Seconds())
		outcome = attemptOutcome(res)
	}
	a.metrics.Attempts.WithLabelValues(outcome).Inc()
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(telemetry.AttrOutcome.String(outcome))
	if startErr != nil {
		span.SetAttributes(telemetry.AttrErrorType.String("start_failed"),
			telemetry.AttrFault.String(faultName(StartFault(startErr))))
		telemetry.RecordError(span, startErr)
		span.End()
		return
	}
	span.SetAttributes(telemetry.AttrProcessPID.Int(exec.Pid()), telemetry.AttrExitCode.Int(res.ExitCode),
		telemetry.AttrDurationSecs.Float64(res.Ended.Sub(res.Started).Seconds()),
		telemetry.AttrOutputSize.Int64(outputSize(dir)))
	if res.Usage.Measured {
		span.SetAttributes(telemetry.AttrCPUSeconds.Float64(res.Usage.CPUSeconds),
			telemetry.AttrMemoryPeak.Int64(res.Usage.MemoryPeakBytes))
	}
	span.AddEvent("process.start", trace.WithTimestamp(res.Started), trace.WithAttributes(telemetry.AttrProcessPID.Int(exec.Pid())))
	span.AddEvent("process.exit", trace.WithTimestamp(res.Ended), trace.WithAttributes(telemetry.AttrExitCode.Int(res.ExitCode)))
	switch {
	case outcome == "failed":
		span.SetAttributes(telemetry.AttrErrorType.String("exit_code"))
		telemetry.RecordError(span, errors.New("exit code "+strconv.Itoa(res.ExitCode)+tailHint(res.StderrTail)))
	case outcome != "exited":
		span.SetAttributes(telemetry.AttrErrorType.String(outcome))
		telemetry.RecordError(span, errors.New(res.Outcome.String()))
	}
	if res.Err != nil {
		span.RecordError(res.Err)
	}
	span.End(trace.WithTimestamp(time.Now()))
}

func attemptOutcome(res *Result) string {
	switch res.Outcome {
	case OutcomeTimedOut:
		return "timed_out"
	case OutcomeCancelled:
		return "cancelled"
	case OutcomeAbandoned:
		return "abandoned"
	}
	if res.ExitCode != 0 {
		return "failed"
	}
	return "exited"
}

// outputSize is the bytes the attempt wrote to stdout and stderr.
func outputSize(dir string) int64 {
	var n int64
	for _, f := range []string{"stdout.log", "stderr.log"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err == nil {
			n += st.Size()
		}
	}
	return n
}

// tailHint is the last line of stderr, for the span's error message.
func tailHint(stderr string) string {
	s := strings.TrimSpace(stderr)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 200 {
		s = s[len(s)-200:]
	}
	if s == "" {
		return ""
	}
	return ": " + s
}
