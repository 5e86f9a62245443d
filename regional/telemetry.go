package regional

// Spans and metrics of the job lifecycle as the coordinator sees it. Every
// span of a job is started from the traceparent stored in its job record, so
// it joins the submission's trace whichever coordinator makes it, after any
// failover or restart. Span attributes are computed only while tracing is on
// (c.tracing).

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// startAccept starts the job.accept span: a child of the caller's span
// (otelgrpc server span) if any, else of the request's traceparent.
func (c *Coordinator) startAccept(ctx context.Context, req *apiaryv1.SubmitJobRequest) (context.Context, trace.Span) {
	if !c.tracing {
		return ctx, trace.SpanFromContext(context.Background())
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = telemetry.ContextWithTraceparent(ctx, req.GetTraceparent())
	}
	ctx, span := c.tracer.Start(ctx, telemetry.SpanAccept, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(telemetry.AttrRegion.String(c.meta.Region), telemetry.AttrCoord.String(c.cfg.ID),
			telemetry.AttrJobName.String(req.GetSpec().GetName())))
	return ctx, span
}

// jobTraceparent is what a new job stores: the request's traceparent, or,
// for a request without one, that of its accept span (the job's trace then
// starts in the region).
func jobTraceparent(ctx context.Context, req *apiaryv1.SubmitJobRequest) string {
	if tp := req.GetTraceparent(); tp != "" {
		return tp
	}
	return telemetry.Traceparent(ctx)
}

// endAccept ends the accept span and counts the submission or refusal.
func (c *Coordinator) endAccept(span trace.Span, rec *store.JobRecord, resp *apiaryv1.SubmitJobResponse, err error) {
	if err != nil {
		c.metrics.Refusals.WithLabelValues(refusalReason(err)).Inc()
	} else if resp.GetDeduplicated() {
		c.metrics.Submissions.WithLabelValues("deduplicated").Inc()
	} else {
		c.metrics.Submissions.WithLabelValues("accepted").Inc()
	}
	if !span.IsRecording() {
		return
	}
	if rec != nil {
		span.SetAttributes(telemetry.AttrJobID.String(resp.GetJobId()), telemetry.AttrShard.Int(rec.Shard),
			telemetry.AttrTaskCount.Int(int(rec.TaskCount)), attribute.Bool("apiary.deduplicated", resp.GetDeduplicated()))
	}
	if err != nil {
		span.SetAttributes(telemetry.AttrReason.String(refusalReason(err)))
		telemetry.RecordError(span, err)
	}
	span.End()
}

// refusalReason is the reason label of a refused submission.
func refusalReason(err error) string {
	st := status.Convert(err)
	switch st.Code() {
	case codes.InvalidArgument:
		return "invalid"
	case codes.FailedPrecondition:
		if strings.HasPrefix(st.Message(), "jurisdiction") {
			return "jurisdiction"
		}
		if strings.HasPrefix(st.Message(), "region.selector") {
			return "region_selector"
		}
		return "precondition"
	case codes.AlreadyExists:
		return "request_id_reused"
	case codes.Unavailable:
		return "unavailable"
	case codes.ResourceExhausted:
		return "overloaded"
	case codes.DeadlineExceeded, codes.Canceled:
		return "cancelled"
	}
	return strings.ToLower(st.Code().String())
}

// dispatchSpan starts the task.dispatch span of an assignment sent to its
// agent and points the assignment's traceparent at it, so the agent's run
// span is its child.
// adoptSpan records one adoption decision as a task.adopt span in the job's
// trace (traceparent: the assignment's), with the refusal's reason.
func (c *Coordinator) adoptSpan(traceparent, nodeID string, newEpoch int64, ref *apiaryv1.AttemptRef, why string) {
	if !c.tracing || traceparent == "" {
		return
	}
	_, span := telemetry.StartFromTraceparent(context.Background(), c.tracer, traceparent, telemetry.SpanAdopt,
		trace.WithAttributes(telemetry.AttrJobID.String(ref.GetJobId()), telemetry.AttrTaskIndex.Int(int(ref.GetTaskIndex())),
			telemetry.AttrAttempt.Int(int(ref.GetAttempt())), telemetry.AttrRegion.String(c.meta.Region),
			telemetry.AttrNodeID.String(nodeID), telemetry.AttrNodeEpoch.Int64(newEpoch),
			telemetry.AttrToken.Int64(ref.GetFencingToken()), telemetry.AttrCoord.String(c.cfg.ID),
			telemetry.AttrOutcome.String(map[bool]string{true: "adopted", false: "refused"}[why == ""]),
			telemetry.AttrReason.String(why)))
	span.End()
}

func (c *Coordinator) dispatchSpan(a *apiaryv1.Assignment) trace.Span {
	if !c.tracing || a.GetKind() != apiaryv1.Assignment_KIND_RUN || a.GetTraceparent() == "" {
		return nil
	}
	ctx, span := telemetry.StartFromTraceparent(context.Background(), c.tracer, a.GetTraceparent(), telemetry.SpanDispatch,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
			telemetry.AttrJobID.String(a.GetJobId()), telemetry.AttrTaskIndex.Int(int(a.GetTaskIndex())),
			telemetry.AttrAttempt.Int(int(a.GetAttempt())), telemetry.AttrRegion.String(c.meta.Region),
			telemetry.AttrNodeEpoch.Int64(a.GetNodeEpoch()), telemetry.AttrToken.Int64(a.GetFencingToken()),
			telemetry.AttrCoord.String(c.cfg.ID)))
	a.Traceparent = telemetry.Traceparent(ctx)
	return span
}

// observeReport records one answered report and, for a committed attempt
// outcome, the task.complete / task.fail / task.retry / task.refused span.
func (c *Coordinator) observeReport(r *apiaryv1.ReportTaskStatusRequest, ans *apiaryv1.ReportTaskStatusResponse, st *reportState, outcome string, start time.Time) {
	result := "accepted"
	if !ans.GetAccepted() {
		result = "rejected"
	}
	c.metrics.Reports.WithLabelValues(taskReportKind(r.GetKind()), result).Inc()
	if !ans.GetAccepted() || outcome == "" || st == nil {
		return
	}
	c.metrics.TaskOutcomes.WithLabelValues(outcome).Inc()
	name := telemetry.SpanFail
	switch {
	case st.task.State == apiaryv1.TaskState_TASK_STATE_COMPLETE:
		name = telemetry.SpanComplete
		if st.job != nil {
			c.metrics.ToComplete.Observe(float64(time.Now().UnixMilli()-st.job.SubmitMs) / 1000)
		}
	case outcome == taskstate.OutcomeRefused:
		name = telemetry.SpanRefused
	case outcome == taskstate.OutcomeCancelled:
		name = telemetry.SpanCancel
	case st.task.State == apiaryv1.TaskState_TASK_STATE_PENDING:
		name = telemetry.SpanRetry
		c.metrics.Retries.Inc()
	}
	if !c.tracing || st.job == nil {
		return
	}
	_, span := telemetry.StartFromTraceparent(context.Background(), c.tracer, st.job.Traceparent, name, trace.WithTimestamp(start),
		trace.WithAttributes(telemetry.AttrJobID.String(r.GetJobId()), telemetry.AttrTaskIndex.Int(int(r.GetTaskIndex())),
			telemetry.AttrAttempt.Int(int(r.GetAttempt())), telemetry.AttrRegion.String(c.meta.Region),
			telemetry.AttrNodeID.String(r.GetNodeId()), telemetry.AttrNodeEpoch.Int64(r.GetNodeEpoch()),
			telemetry.AttrShard.Int(st.shard), telemetry.AttrOutcome.String(outcome),
			telemetry.AttrExitCode.Int(int(r.GetExitCode())), telemetry.AttrReportKind.String(taskReportKind(r.GetKind())),
			telemetry.AttrCoord.String(c.cfg.ID)))
	if name == telemetry.SpanFail || name == telemetry.SpanRetry {
		msg := firstNonEmpty(r.GetError(), st.task.Error)
		if msg == "" {
			msg = "attempt " + outcome
		}
		telemetry.RecordError(span, errors.New(msg))
	}
	for _, a := range st.results {
		if a.GetAttempt() == r.GetAttempt() && a.GetFault() != apiaryv1.FailureFault_FAILURE_FAULT_UNSPECIFIED {
			span.SetAttributes(telemetry.AttrFault.String(strings.ToLower(strings.TrimPrefix(a.GetFault().String(), "FAILURE_FAULT_"))))
		}
	}
	if name == telemetry.SpanRetry && st.task.NotBeforeMs > 0 {
		span.SetAttributes(attribute.Int64("apiary.retry.not_before_ms", st.task.NotBeforeMs))
	}
	span.End()
}

func taskReportKind(k apiaryv1.ReportKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "REPORT_KIND_"))
}
