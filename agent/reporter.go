package agent

import (
	"context"
	"log/slog"
	"time"

	"github.com/grafana/dskit/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// reporter delivers ReportTaskStatus calls: retried with backoff (moving to
// the next coordinator) on transient errors, until accepted or rejected.
type reporter struct {
	coords     *coordinators
	rpcTimeout time.Duration
	backoff    backoff.Config
	log        *slog.Logger
}

// reportResult is the coordinator's answer to one report.
type reportResult struct {
	accepted bool
	reason   string // why it was rejected
	// epochEnded: rejected because the report's node epoch is no longer
	// the node's (ReportTaskStatusResponse.node_epoch_ended).
	epochEnded bool
	// delivered is false when ctx ended or giveUp fired first; the report's
	// fate is then unknown.
	delivered bool
}

// send delivers req. It stops retrying when ctx is done or giveUp is closed
// (nil never closes). A non-transient gRPC error counts as a rejection: the
// coordinator answered and will not take the report. epoch, if not nil,
// gives the node epoch to send each try with (an attempt adopted by a new
// epoch while its report waited is reported with the new one). wake, if not
// nil, cuts one backoff wait short when it closes (the coordinators answer
// again after a disconnect: held reports go at once, not up to a backoff
// later).
func (r *reporter) send(ctx context.Context, req *apiaryv1.ReportTaskStatusRequest, giveUp <-chan struct{}, epoch func() int64, wake <-chan struct{}) reportResult {
	b := backoff.New(ctx, r.backoff)
	for b.Ongoing() {
		if epoch != nil {
			req.NodeEpoch = epoch()
		}
		idx, cl := r.coords.client()
		cctx, cancel := context.WithTimeout(ctx, r.rpcTimeout)
		resp, err := cl.ReportTaskStatus(cctx, req)
		cancel()
		if err == nil {
			return reportResult{accepted: resp.GetAccepted(), reason: resp.GetReason(), epochEnded: resp.GetNodeEpochEnded(), delivered: true}
		}
		if ctx.Err() != nil {
			break
		}
		if !transient(err) {
			return reportResult{reason: err.Error(), delivered: true}
		}
		if status.Code(err) == codes.Unavailable {
			r.coords.failover(idx)
		}
		r.log.Debug("report not delivered, retrying", "kind", req.GetKind().String(),
			"job", req.GetJobId(), "task", req.GetTaskIndex(), "attempt", req.GetAttempt(),
			"coordinator", r.coords.addr(idx), "err", err)
		t := time.NewTimer(b.NextDelay())
		select {
		case <-giveUp:
			t.Stop()
			return reportResult{}
		case <-ctx.Done():
			t.Stop()
		case <-wake:
			t.Stop()
			wake = nil
			b.Reset()
		case <-t.C:
		}
	}
	return reportResult{}
}
