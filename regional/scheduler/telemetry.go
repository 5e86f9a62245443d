package scheduler

// Spans and metrics of the scheduling loop: task.place and task.reclaim
// spans, started from the traceparent stored in the job record (so they
// join the submission's trace whichever coordinator makes them), and the
// placement, reclaim, task, node and per-shard gauges. Span attributes are
// computed only while tracing is on (Deps.Tracing). The coordinator's own
// spans and metrics are regional/telemetry.go's.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/taskstate"
)

// placedChunk is one node's placements of a pass and whether they committed.
type placedChunk struct {
	nodeID    string
	ps        []placement.Placement
	committed bool
}

// observePlacements records the placements of one pass: metrics, and one
// task.place span per task (committed on a node, or conflicting and requeued).
func (s *Loop) observePlacements(chunks []*placedChunk, byKey map[string]*cTask, planned time.Time, conflicts int) {
	m := s.d.Metrics
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
			if !s.d.Tracing || j == nil {
				continue
			}
			opts := []trace.SpanStartOption{trace.WithTimestamp(planned), trace.WithAttributes(
				telemetry.AttrJobID.String(ct.rec.JobID), telemetry.AttrTaskIndex.Int(int(ct.rec.Index)),
				telemetry.AttrAttempt.Int(int(attempt)), telemetry.AttrRegion.String(s.d.Region),
				telemetry.AttrNodeID.String(p.NodeID), telemetry.AttrShard.Int(ct.shard),
				telemetry.AttrEpoch.Int64(int64(s.owned[ct.shard])), telemetry.AttrScore.Float64(p.Score),
				telemetry.AttrConflict.Bool(!ch.committed), telemetry.AttrRequeued.Bool(!ch.committed),
				telemetry.AttrCoord.String(s.d.CoordID),
				telemetry.AttrFetchBytes.Int64(fetchBytes(s.cache, &ct.rec, s.snap.idx[p.NodeID], s.snap.datasetSize)))}
			if l, ok := telemetry.AttemptLink(j.rec.Traceparent, ct.rec.JobID, ct.rec.Index, ct.rec.Attempt, "replaces"); ok {
				opts = append(opts, trace.WithLinks(l))
			}
			_, span := telemetry.StartFromTraceparent(context.Background(), s.d.Tracer, j.rec.Traceparent, telemetry.SpanPlace, opts...)
			if !ch.committed {
				span.AddEvent("plan conflict: requeued", trace.WithTimestamp(now))
			}
			span.End(trace.WithTimestamp(now))
		}
	}
}

// observeReclaim records one reclaimed attempt of a lost node epoch.
func (s *Loop) observeReclaim(ct *cTask, newRec *taskstate.Task, nodeID, why string, start time.Time) {
	s.d.Metrics.Reclaims.Inc()
	s.d.Metrics.TaskOutcomes.WithLabelValues(taskstate.OutcomeLost).Inc()
	j := s.cache.jobs[ct.rec.JobID]
	if !s.d.Tracing || j == nil {
		return
	}
	opts := []trace.SpanStartOption{trace.WithTimestamp(start), trace.WithAttributes(
		telemetry.AttrJobID.String(ct.rec.JobID), telemetry.AttrTaskIndex.Int(int(ct.rec.Index)),
		telemetry.AttrAttempt.Int(int(ct.rec.Attempt)), telemetry.AttrRegion.String(s.d.Region),
		telemetry.AttrNodeID.String(nodeID), telemetry.AttrNodeEpoch.Int64(ct.rec.NodeEpoch),
		telemetry.AttrShard.Int(ct.shard), telemetry.AttrEpoch.Int64(int64(s.owned[ct.shard])),
		telemetry.AttrOutcome.String(newRec.State.String()), telemetry.AttrCoord.String(s.d.CoordID),
		telemetry.AttrReason.String(why))}
	if l, ok := telemetry.AttemptLink(j.rec.Traceparent, ct.rec.JobID, ct.rec.Index, ct.rec.Attempt, "reclaims"); ok {
		opts = append(opts, trace.WithLinks(l))
	}
	_, span := telemetry.StartFromTraceparent(context.Background(), s.d.Tracer, j.rec.Traceparent, telemetry.SpanReclaim, opts...)
	if newRec.State != apiaryv1.TaskState_TASK_STATE_PENDING || newRec.Used > ct.rec.Used {
		telemetry.RecordError(span, fmt.Errorf("node %s epoch %d lost", nodeID, ct.rec.NodeEpoch))
	}
	span.End()
}

// updateGauges sets the task and pending-per-shard gauges of the owned
// shards and the node gauges, and publishes every shard's counts
// (ListShards), at most once a second.
func (s *Loop) updateGauges(now time.Time) {
	if now.Sub(s.gaugesAt) < time.Second {
		return
	}
	s.gaugesAt = now
	m := s.d.Metrics
	c := s.cache
	// From the cache's per-shard counts (ownerCache.shardTasks): one pass
	// over the shards, not over every task.
	stats := make([]ShardStat, s.d.ShardCount)
	states := map[apiaryv1.TaskState]int{}
	for sh, sc := range c.shardTasks {
		if sh >= 0 && sh < len(stats) {
			st := &stats[sh]
			for state, n := range sc.states {
				switch {
				case state == apiaryv1.TaskState_TASK_STATE_PENDING:
					st.Pending += n
				case taskstate.Active(state):
					st.Running += n
				}
			}
			st.LastPlanMs = sc.lastAssigned
		}
		if s.owns(sh) {
			for state, n := range sc.states {
				states[state] += n
			}
		}
	}
	m.PendingTasks.Reset()
	for sh := range s.owned {
		if sh < len(stats) && stats[sh].Pending > 0 {
			m.PendingTasks.WithLabelValues(telemetry.ShardLabel(sh)).Set(float64(stats[sh].Pending))
		}
	}
	if s.d.Publish != nil {
		s.d.Publish(stats)
	}
	m.Tasks.Reset()
	for st, n := range states {
		m.Tasks.WithLabelValues(taskStateLabel(st)).Set(float64(n))
	}
	ready, lost, quarantined := 0, 0, 0
	for _, n := range c.nodes {
		if n.Ready() {
			ready++
		} else if n.Rec != nil {
			lost++
		}
		if n.Rec != nil && (n.Rec.Quarantined || n.Health.Quarantine != nil) {
			quarantined++
		}
	}
	m.Nodes.WithLabelValues("ready").Set(float64(ready))
	m.Nodes.WithLabelValues("lost").Set(float64(lost))
	m.Quarantined.Set(float64(quarantined))
}

// SkippedCounter is apiary_owner_skipped_records_total on reg: records the
// owner loop left out, by what (task, job, node: the value did not decode;
// assign, marshal: a planned task could not be written; antiaffinity: a
// planned task whose anti-affinity scope the round had filled already, which
// the engine does not do). Registered once per
// registry; later owner terms reuse it.
func SkippedCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	cv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "apiary_owner_skipped_records_total",
		Help: "Records the shard owner left out, by what (task, job, node: undecodable; assign, marshal, antiaffinity: a planned task not written)."},
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
