package regional

import (
	"context"
	"encoding/json"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// maxAdoptAttempts bounds one AdoptAttempts request.
const maxAdoptAttempts = 10000

// AdoptAttempts moves the attempts an agent still runs from its ended epoch
// to its current one (see the RPC's doc in apiary.proto). Each attempt is
// decided on its own: adopted in one Txn that compares the task's
// ModRevision (it was not reclaimed or re-dispatched since the read), the
// node's alive key (the new epoch still lives) and the assignment's
// CreateRevision (the fencing token), rewriting the task and the assignment
// with the new epoch; refused otherwise. Like reports, these are compared
// writes that any coordinator may commit: a concurrent reclaim by the shard
// owner and an adoption cannot both succeed. Errors: INVALID_ARGUMENT for a
// malformed request, FAILED_PRECONDITION when node_epoch is not current,
// UNAVAILABLE when etcd failed (decisions already committed stand; the
// agent asks again and gets "adopted" for those, as their task now carries
// the new epoch).
func (s *agentServer) AdoptAttempts(ctx context.Context, req *apiaryv1.AdoptAttemptsRequest) (*apiaryv1.AdoptAttemptsResponse, error) {
	c := s.c
	if err := checkNodeID(req.GetNodeId()); err != nil {
		return nil, err
	}
	if n := len(req.GetAttempts()); n > maxAdoptAttempts {
		return nil, status.Errorf(codes.InvalidArgument, "attempts: at most %d (got %d)", maxAdoptAttempts, n)
	}
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	if _, err := c.nodeLease(cctx, req.GetNodeId(), req.GetNodeEpoch()); err != nil {
		return nil, err
	}
	out := &apiaryv1.AdoptAttemptsResponse{}
	adopted := 0
	for i, ref := range req.GetAttempts() {
		d, err := c.adoptOne(cctx, req.GetNodeId(), req.GetNodeEpoch(), ref)
		if err != nil {
			return nil, fmt.Errorf("attempts[%d]: %w", i, err)
		}
		if d.Adopted {
			adopted++
		}
		out.Decisions = append(out.Decisions, d)
	}
	c.metrics.Adoptions.WithLabelValues("adopted").Add(float64(adopted))
	c.metrics.Adoptions.WithLabelValues("refused").Add(float64(len(out.Decisions) - adopted))
	c.log.Info("adoption after reconnect", "node", req.GetNodeId(), "epoch", req.GetNodeEpoch(),
		"attempts", len(out.Decisions), "adopted", adopted)
	return out, nil
}

// adoptOne decides one attempt (see AdoptAttempts). Its error is a gRPC
// status for the whole request.
func (c *Coordinator) adoptOne(ctx context.Context, nodeID string, epoch int64, ref *apiaryv1.AttemptRef) (*apiaryv1.AdoptDecision, error) {
	refuse := func(why string) *apiaryv1.AdoptDecision {
		return &apiaryv1.AdoptDecision{Attempt: ref, Reason: why}
	}
	shard, err := c.checkJobID(ref.GetJobId())
	if status.Code(err) == codes.NotFound {
		return refuse("job not in this region"), nil
	}
	if err != nil {
		return nil, err
	}
	tk, ak := store.KeyTask(shard, ref.GetJobId(), ref.GetTaskIndex()), store.KeyAssign(nodeID, ref.GetJobId(), ref.GetTaskIndex())
	for try := 0; try < 3; try++ {
		resp, err := c.cli.Txn(ctx).Then(clientv3.OpGet(tk), clientv3.OpGet(ak)).Commit()
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "read task: %v", err)
		}
		tkv, akv := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
		if len(tkv) != 1 {
			return refuse("task not found (job deleted)"), nil
		}
		var t taskstate.Task
		if err := json.Unmarshal(tkv[0].Value, &t); err != nil {
			return nil, status.Errorf(codes.Internal, "task %s does not decode: %v", tk, err)
		}
		if t.NodeID == nodeID && t.NodeEpoch == epoch && t.Attempt == ref.GetAttempt() && t.FencingToken == ref.GetFencingToken() {
			// Adopted before (a retried request).
			return &apiaryv1.AdoptDecision{Attempt: ref, Adopted: true}, nil
		}
		nt, why := taskstate.Adopt(t, nodeID, ref.GetNodeEpoch(), ref.GetAttempt(), ref.GetFencingToken(), epoch)
		if why == "" && (len(akv) != 1 || store.AssignToken(akv[0].Value, akv[0].CreateRevision) != ref.GetFencingToken()) {
			why = "assignment gone or re-issued"
		}
		var a apiaryv1.Assignment
		if len(akv) == 1 {
			if err := proto.Unmarshal(akv[0].Value, &a); err != nil {
				return nil, status.Errorf(codes.Internal, "assignment %s does not decode: %v", ak, err)
			}
		}
		if why != "" {
			c.adoptSpan(a.GetTraceparent(), nodeID, epoch, ref, why)
			return refuse(why), nil
		}
		a.NodeEpoch = epoch
		b, err := proto.Marshal(&a)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "encode assignment: %v", err)
		}
		put, err := c.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(tk), "=", tkv[0].ModRevision),
			clientv3.Compare(clientv3.CreateRevision(store.KeyNodeAlive(nodeID)), "=", epoch),
			clientv3.Compare(clientv3.CreateRevision(ak), "=", store.TokenRevision(ref.GetFencingToken())),
		).Then(clientv3.OpPut(tk, store.MustJSON(&nt)), clientv3.OpPut(ak, string(b))).Commit()
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "adopt: %v", err)
		}
		if put.Succeeded {
			c.adoptSpan(a.GetTraceparent(), nodeID, epoch, ref, "")
			return &apiaryv1.AdoptDecision{Attempt: ref, Adopted: true}, nil
		}
		// The task, the epoch or the assignment changed meanwhile: decide
		// again from a fresh read.
	}
	return nil, status.Errorf(codes.Aborted, "task %s/%d kept changing; retry", ref.GetJobId(), ref.GetTaskIndex())
}
