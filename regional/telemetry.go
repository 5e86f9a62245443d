package regional

// Spans and metrics of the job lifecycle as the coordinator sees it. Every
// span of a job is started from the traceparent stored in its job record, so
// it joins the submission's trace whichever coordinator makes it, after any
// failover or restart. Span attributes are computed only while tracing is on
// (c.tracing).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/placement"
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
func (c *Coordinator) endAccept(span trace.Span, rec *jobRecord, resp *apiaryv1.SubmitJobResponse, err error) {
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

// placedChunk is one node's placements of a pass and whether they committed.
type placedChunk struct {
	nodeID    string
	ps        []placement.Placement
	committed bool
}

// observePlacements records the placements of one pass: metrics, and one
// task.place span per task (committed on a node, or conflicting and requeued).
func (s *scheduler) observePlacements(chunks []*placedChunk, byKey map[string]*cTask, planned time.Time, conflicts int) {
	m := s.d.metrics
	if conflicts > 0 {
		m.PlanConflicts.Add(float64(conflicts))
	}
	now := time.Now()
	for _, ch := range chunks {
		if ch.committed {
			m.Placements.Add(float64(len(ch.ps)))
		} else {
			m.Requeues.Add(float64(len(ch.ps)))
		}
		for _, p := range ch.ps {
			ct := byKey[p.TaskID]
			if ct == nil {
				continue
			}
			j := s.cache.jobs[ct.rec.JobID]
			attempt := ct.rec.Attempt + 1
			if ch.committed && attempt == 1 && j != nil {
				m.ToDispatch.Observe(float64(now.UnixMilli()-j.rec.SubmitMs) / 1000)
			}
			if !s.d.tracing || j == nil {
				continue
			}
			opts := []trace.SpanStartOption{trace.WithTimestamp(planned), trace.WithAttributes(
				telemetry.AttrJobID.String(ct.rec.JobID), telemetry.AttrTaskIndex.Int(int(ct.rec.Index)),
				telemetry.AttrAttempt.Int(int(attempt)), telemetry.AttrRegion.String(s.d.region),
				telemetry.AttrNodeID.String(p.NodeID), telemetry.AttrShard.Int(ct.shard),
				telemetry.AttrEpoch.Int64(int64(s.owned[ct.shard])), telemetry.AttrScore.Float64(p.Score),
				telemetry.AttrConflict.Bool(!ch.committed), telemetry.AttrRequeued.Bool(!ch.committed),
				telemetry.AttrCoord.String(s.d.coordID))}
			if l, ok := telemetry.AttemptLink(j.rec.Traceparent, ct.rec.JobID, ct.rec.Index, ct.rec.Attempt, "replaces"); ok {
				opts = append(opts, trace.WithLinks(l))
			}
			_, span := telemetry.StartFromTraceparent(context.Background(), s.d.tracer, j.rec.Traceparent, telemetry.SpanPlace, opts...)
			if !ch.committed {
				span.AddEvent("plan conflict: requeued", trace.WithTimestamp(now))
			}
			span.End(trace.WithTimestamp(now))
		}
	}
}

// observeReclaim records one reclaimed attempt of a lost node epoch.
func (s *scheduler) observeReclaim(ct *cTask, newRec *taskstate.Task, nodeID, why string, start time.Time) {
	s.d.metrics.Reclaims.Inc()
	s.d.metrics.TaskOutcomes.WithLabelValues(taskstate.OutcomeLost).Inc()
	j := s.cache.jobs[ct.rec.JobID]
	if !s.d.tracing || j == nil {
		return
	}
	opts := []trace.SpanStartOption{trace.WithTimestamp(start), trace.WithAttributes(
		telemetry.AttrJobID.String(ct.rec.JobID), telemetry.AttrTaskIndex.Int(int(ct.rec.Index)),
		telemetry.AttrAttempt.Int(int(ct.rec.Attempt)), telemetry.AttrRegion.String(s.d.region),
		telemetry.AttrNodeID.String(nodeID), telemetry.AttrNodeEpoch.Int64(ct.rec.NodeEpoch),
		telemetry.AttrShard.Int(ct.shard), telemetry.AttrEpoch.Int64(int64(s.owned[ct.shard])),
		telemetry.AttrOutcome.String(newRec.State.String()), telemetry.AttrCoord.String(s.d.coordID),
		telemetry.AttrReason.String(why))}
	if l, ok := telemetry.AttemptLink(j.rec.Traceparent, ct.rec.JobID, ct.rec.Index, ct.rec.Attempt, "reclaims"); ok {
		opts = append(opts, trace.WithLinks(l))
	}
	_, span := telemetry.StartFromTraceparent(context.Background(), s.d.tracer, j.rec.Traceparent, telemetry.SpanReclaim, opts...)
	if newRec.State != apiaryv1.TaskState_TASK_STATE_PENDING || newRec.Used > ct.rec.Used {
		telemetry.RecordError(span, fmt.Errorf("node %s epoch %d lost", nodeID, ct.rec.NodeEpoch))
	}
	span.End()
}

// updateGauges sets the task and pending-per-shard gauges of the owned
// shards and the node gauges, and publishes every shard's counts
// (ListShards), at most once a second.
func (s *scheduler) updateGauges(now time.Time) {
	if now.Sub(s.gaugesAt) < time.Second {
		return
	}
	s.gaugesAt = now
	m := s.d.metrics
	c := s.cache
	stats := make([]shardStat, s.d.shardCount)
	states := map[apiaryv1.TaskState]int{}
	for _, ct := range c.tasks {
		if ct.shard >= 0 && ct.shard < len(stats) {
			st := &stats[ct.shard]
			switch {
			case ct.rec.State == apiaryv1.TaskState_TASK_STATE_PENDING:
				st.pending++
			case taskstate.Active(ct.rec.State):
				st.running++
			}
			st.lastPlanMs = max(st.lastPlanMs, ct.rec.AssignedMs)
		}
		if s.owns(ct.shard) {
			states[ct.rec.State]++
		}
	}
	m.PendingTasks.Reset()
	for sh := range s.owned {
		if sh < len(stats) && stats[sh].pending > 0 {
			m.PendingTasks.WithLabelValues(telemetry.ShardLabel(sh)).Set(float64(stats[sh].pending))
		}
	}
	if s.d.publish != nil {
		s.d.publish(stats)
	}
	m.Tasks.Reset()
	for st, n := range states {
		m.Tasks.WithLabelValues(taskStateLabel(st)).Set(float64(n))
	}
	ready, lost, quarantined := 0, 0, 0
	for _, n := range c.nodes {
		if n.ready() {
			ready++
		} else if n.rec != nil {
			lost++
		}
		if n.rec != nil && (n.rec.Quarantined || n.health.Quarantine != nil) {
			quarantined++
		}
	}
	m.Nodes.WithLabelValues("ready").Set(float64(ready))
	m.Nodes.WithLabelValues("lost").Set(float64(lost))
	m.Quarantined.Set(float64(quarantined))
}

// skippedCounter is apiary_owner_skipped_records_total on reg: records the
// owner loop left out, by what (task, job, node: the value did not decode;
// assign, marshal: a planned task could not be written). Registered once per
// registry; later owner terms reuse it.
func skippedCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	cv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "apiary_owner_skipped_records_total",
		Help: "Records the shard owner left out, by what (task, job, node: undecodable; assign, marshal: a planned task not written)."},
		[]string{"what"})
	if reg == nil {
		return cv
	}
	cv, _ = telemetry.RegisterCounterVec(reg, cv) // unregistered on another error: still counts, unexported
	return cv
}

func taskStateLabel(s apiaryv1.TaskState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "TASK_STATE_"))
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
