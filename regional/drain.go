package regional

import (
	"context"
	"encoding/json"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
)

// Drain and eligibility (Nomad's node drain and node eligibility): both are
// fields of the node record, so they survive coordinator restarts and, for
// an operator's, the node registering again. Placement leaves draining and
// ineligible nodes out; the agent learns of a drain from its heartbeat
// answer (HeartbeatResponse.drain_deadline_ms) and stops what still runs at
// the deadline, reporting it DRAINED (requeued at once, not charged).

// maxDrainAhead bounds a drain deadline: a week from now.
const maxDrainAhead = 7 * 24 * time.Hour

// checkDrainDeadline is INVALID_ARGUMENT naming deadline_ms unless d is 0
// (at once) or a Unix ms time at most maxDrainAhead from now.
func checkDrainDeadline(d int64) error {
	if d < 0 || d > time.Now().Add(maxDrainAhead).UnixMilli() {
		return status.Errorf(codes.InvalidArgument, "deadline_ms: must be 0 (at once) or a Unix ms time at most 7 days ahead (got %d)", d)
	}
	return nil
}

// DrainNode starts or ends an operator's drain (see the RPC's doc in
// apiary.proto). Draining a draining node replaces its deadline and who
// asked. Ending a drain leaves the node ineligible until SetNodeEligibility
// turns it back on, as Nomad does.
func (s *adminServer) DrainNode(ctx context.Context, req *apiaryv1.DrainNodeRequest) (*apiaryv1.DrainNodeResponse, error) {
	if err := checkNodeID(req.GetNodeId()); err != nil {
		return nil, err
	}
	if err := checkFreeText("by", req.GetBy(), maxQuarantineBy, false); err != nil {
		return nil, err
	}
	if err := checkDrainDeadline(req.GetDeadlineMs()); err != nil {
		return nil, err
	}
	c := s.c
	n, changed, err := c.updateNodeRecord(ctx, req.GetNodeId(), func(r *store.NodeRecord) (bool, error) {
		if req.GetCancel() {
			if !r.Draining {
				return false, nil
			}
			r.Draining, r.DrainDeadlineMs, r.DrainBy = false, 0, ""
			r.Ineligible = true
			return true, nil
		}
		r.Draining, r.DrainDeadlineMs, r.DrainBy = true, req.GetDeadlineMs(), "operator "+req.GetBy()
		r.Ineligible = true
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if changed {
		kind := "operator"
		if req.GetCancel() {
			kind = "cancel"
		}
		c.metrics.Drains.WithLabelValues(kind).Inc()
		c.log.Warn("node drain", "node", req.GetNodeId(), "cancel", req.GetCancel(), "deadline_ms", req.GetDeadlineMs(), "by", req.GetBy())
	}
	return &apiaryv1.DrainNodeResponse{Node: n}, nil
}

// SetNodeEligibility turns new placements on a node on or off (see the
// RPC's doc in apiary.proto). Turning a draining node eligible is refused
// (FAILED_PRECONDITION): the drain must be cancelled first.
func (s *adminServer) SetNodeEligibility(ctx context.Context, req *apiaryv1.SetNodeEligibilityRequest) (*apiaryv1.SetNodeEligibilityResponse, error) {
	if err := checkNodeID(req.GetNodeId()); err != nil {
		return nil, err
	}
	if err := checkFreeText("by", req.GetBy(), maxQuarantineBy, false); err != nil {
		return nil, err
	}
	c := s.c
	n, changed, err := c.updateNodeRecord(ctx, req.GetNodeId(), func(r *store.NodeRecord) (bool, error) {
		if req.GetEligible() && r.Draining {
			return false, status.Errorf(codes.FailedPrecondition,
				"eligible: node %s is draining; end the drain first (apiary node drain %s --cancel), as Nomad requires", req.GetNodeId(), req.GetNodeId())
		}
		if r.Ineligible == !req.GetEligible() {
			return false, nil
		}
		r.Ineligible = !req.GetEligible()
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if changed {
		c.log.Info("node eligibility", "node", req.GetNodeId(), "eligible", req.GetEligible(), "by", req.GetBy())
	}
	return &apiaryv1.SetNodeEligibilityResponse{Node: n}, nil
}

// DrainSelf records an agent's shutdown drain (see the RPC's doc). An
// operator's drain already in force keeps its owner; its deadline only moves
// earlier.
func (s *agentServer) DrainSelf(ctx context.Context, req *apiaryv1.DrainSelfRequest) (*apiaryv1.DrainSelfResponse, error) {
	if err := checkNodeID(req.GetNodeId()); err != nil {
		return nil, err
	}
	if err := checkDrainDeadline(req.GetDeadlineMs()); err != nil {
		return nil, err
	}
	c := s.c
	_, changed, err := c.updateNodeRecord(ctx, req.GetNodeId(), func(r *store.NodeRecord) (bool, error) {
		if r.Epoch != req.GetNodeEpoch() {
			return false, status.Errorf(codes.FailedPrecondition, "node %s epoch %d is gone", req.GetNodeId(), req.GetNodeEpoch())
		}
		if r.Draining && r.DrainBy != store.DrainByAgent {
			if r.DrainDeadlineMs != 0 && r.DrainDeadlineMs <= req.GetDeadlineMs() {
				return false, nil
			}
			r.DrainDeadlineMs = req.GetDeadlineMs()
			return true, nil
		}
		r.Draining, r.DrainDeadlineMs, r.DrainBy = true, req.GetDeadlineMs(), store.DrainByAgent
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if changed {
		c.metrics.Drains.WithLabelValues("agent").Inc()
		c.log.Info("node draining for agent shutdown", "node", req.GetNodeId(), "epoch", req.GetNodeEpoch(), "deadline_ms", req.GetDeadlineMs())
	}
	return &apiaryv1.DrainSelfResponse{}, nil
}

// Deregister ends a node epoch after a clean shutdown (see the RPC's doc):
// one Txn marks the record Left and deletes the alive key, compared on the
// epoch and the record's ModRevision; then the lease is revoked. The owner's
// reclaim requeues any task the epoch still held without charge.
func (s *agentServer) Deregister(ctx context.Context, req *apiaryv1.DeregisterRequest) (*apiaryv1.DeregisterResponse, error) {
	if err := checkNodeID(req.GetNodeId()); err != nil {
		return nil, err
	}
	c := s.c
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	id, alive, key := req.GetNodeId(), store.KeyNodeAlive(req.GetNodeId()), store.KeyNode(req.GetNodeId())
	for i := 0; i < 4; i++ {
		resp, err := c.cli.Txn(cctx).Then(clientv3.OpGet(alive), clientv3.OpGet(key)).Commit()
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "read node: %v", err)
		}
		akv, rkv := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
		if len(akv) != 1 || akv[0].CreateRevision != req.GetNodeEpoch() || len(rkv) != 1 {
			return nil, status.Errorf(codes.FailedPrecondition, "node %s epoch %d is gone", id, req.GetNodeEpoch())
		}
		var rec store.NodeRecord
		if err := json.Unmarshal(rkv[0].Value, &rec); err != nil {
			return nil, status.Errorf(codes.Internal, "node %s: its record does not decode: %v", id, err)
		}
		rec.Left = true
		if rec.Draining && rec.DrainBy == store.DrainByAgent {
			rec.Draining, rec.DrainDeadlineMs, rec.DrainBy = false, 0, ""
		}
		put, err := c.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(alive), "=", req.GetNodeEpoch()),
			clientv3.Compare(clientv3.ModRevision(key), "=", rkv[0].ModRevision)).
			Then(clientv3.OpPut(key, store.MustJSON(&rec)), clientv3.OpDelete(alive)).Commit()
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "deregister: %v", err)
		}
		if !put.Succeeded {
			continue
		}
		if _, err := c.cli.Revoke(cctx, clientv3.LeaseID(akv[0].Lease)); err != nil && status.Code(err) != codes.NotFound {
			c.log.Warn("deregister: revoke node lease", "node", id, "err", err)
		}
		c.metrics.Drains.WithLabelValues("deregister").Inc()
		c.log.Info("node left", "node", id, "epoch", req.GetNodeEpoch())
		c.refreshCapacityAfter(ctx, put.Header.Revision)
		return &apiaryv1.DeregisterResponse{}, nil
	}
	return nil, status.Errorf(codes.Aborted, "node %s kept changing; retry", id)
}
