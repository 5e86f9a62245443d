package regional

import (
	"context"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/nodehealth"
	"apiary.dev/apiary/regional/store"
)

// Limits of the operator's quarantine fields (bytes).
const (
	maxQuarantineReason = 256
	maxQuarantineBy     = 128
)

// QuarantineNode stores an operator's quarantine in the node's record (see
// the RPC's doc in apiary.proto). Quarantining a quarantined node replaces
// its reason and who asked, and keeps since when.
func (s *adminServer) QuarantineNode(ctx context.Context, req *apiaryv1.QuarantineNodeRequest) (*apiaryv1.QuarantineNodeResponse, error) {
	if err := checkNodeID(req.GetNodeId()); err != nil {
		return nil, err
	}
	if err := checkFreeText("reason", req.GetReason(), maxQuarantineReason, true); err != nil {
		return nil, err
	}
	if err := checkFreeText("by", req.GetBy(), maxQuarantineBy, false); err != nil {
		return nil, err
	}
	c := s.c
	n, changed, err := c.updateNodeRecord(ctx, req.GetNodeId(), func(r *store.NodeRecord) (bool, error) {
		if !r.Quarantined {
			r.QuarantinedMs = time.Now().UnixMilli()
		}
		r.Quarantined, r.QuarantineReason, r.QuarantinedBy = true, req.GetReason(), req.GetBy()
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if changed {
		c.log.Warn("node quarantined", "node", req.GetNodeId(), "reason", req.GetReason(), "by", req.GetBy(),
			"since_ms", n.GetQuarantinedTimeMs())
	}
	return &apiaryv1.QuarantineNodeResponse{Node: n}, nil
}

// ReleaseNode clears a node's quarantine, an operator's and an automatic
// one alike (see the RPC's doc in apiary.proto); an automatic quarantine's
// strikes are kept, so that a node quarantined again soon waits longer for
// its canary.
func (s *adminServer) ReleaseNode(ctx context.Context, req *apiaryv1.ReleaseNodeRequest) (*apiaryv1.ReleaseNodeResponse, error) {
	if err := checkNodeID(req.GetNodeId()); err != nil {
		return nil, err
	}
	if err := checkFreeText("by", req.GetBy(), maxQuarantineBy, false); err != nil {
		return nil, err
	}
	c := s.c
	var was store.NodeRecord
	var wasAuto *nodehealth.Quarantine
	n, changed, err := c.updateNode(ctx, req.GetNodeId(), func(r *store.NodeRecord, h *nodehealth.Record) (bool, error) {
		was, wasAuto = *r, h.Quarantine
		released := false
		*h, released = h.Release(time.Now().UnixMilli())
		if !r.Quarantined && !released {
			return false, nil
		}
		r.Quarantined, r.QuarantineReason, r.QuarantinedBy, r.QuarantinedMs = false, "", "", 0
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if changed {
		reason, since := was.QuarantineReason, was.QuarantinedMs
		if !was.Quarantined && wasAuto != nil {
			reason, since = wasAuto.Reason, wasAuto.SinceMs
		}
		c.log.Info("node released from quarantine", "node", req.GetNodeId(), "by", req.GetBy(), "automatic", wasAuto != nil,
			"reason_was", reason, "quarantined_for", time.Since(time.UnixMilli(since)).Round(time.Second).String())
	}
	return &apiaryv1.ReleaseNodeResponse{Node: n, WasQuarantined: changed}, nil
}

// checkFreeText checks an operator's free-text field: valid UTF-8 of at most
// max bytes without NUL or newline, not empty when required. Errors:
// INVALID_ARGUMENT naming the field and the rule.
func checkFreeText(field, v string, max int, required bool) error {
	switch {
	case required && strings.TrimSpace(v) == "":
		return status.Errorf(codes.InvalidArgument, "%s: is required", field)
	case len(v) > max:
		return status.Errorf(codes.InvalidArgument, "%s: at most %d bytes (got %d)", field, max, len(v))
	case !utf8.ValidString(v) || strings.ContainsAny(v, "\x00\n\r"):
		return status.Errorf(codes.InvalidArgument, "%s: must be valid UTF-8 without NUL or newline", field)
	}
	return nil
}

// updateNodeRecord applies edit to the node's record and writes it in one
// Txn compared on the record's ModRevision (retried from a fresh read when
// the record changed meanwhile, e.g. by a registration). edit returns false
// to write nothing, or an error (a gRPC status) to refuse: it is returned
// as is. It returns the node as stored and whether it wrote.
// Errors: NOT_FOUND when the region has no record of the node, ABORTED when
// the record kept changing, UNAVAILABLE when etcd failed.
func (c *Coordinator) updateNodeRecord(ctx context.Context, id string, edit func(*store.NodeRecord) (bool, error)) (*apiaryv1.Node, bool, error) {
	return c.updateNode(ctx, id, func(r *store.NodeRecord, _ *nodehealth.Record) (bool, error) { return edit(r) })
}

// updateNode is updateNodeRecord whose edit may also change the node's
// health record (nodehealth); when an automatic quarantine begins or ends
// the region's quarantine set follows, in the same Txn, compared on the
// ModRevision of all three.
func (c *Coordinator) updateNode(ctx context.Context, id string, edit func(*store.NodeRecord, *nodehealth.Record) (bool, error)) (*apiaryv1.Node, bool, error) {
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	key := store.KeyNode(id)
	read := []clientv3.Op{clientv3.OpGet(key), clientv3.OpGet(store.KeyNodeAlive(id)), clientv3.OpGet(store.KeyNodeUsage(id)),
		clientv3.OpGet(store.KeyNodeHealth(id)), clientv3.OpGet(store.KeyQuarantineSet)}
	for i := 0; i < 4; i++ {
		resp, err := c.cli.Txn(cctx).Then(read...).Commit()
		if err != nil {
			return nil, false, status.Errorf(codes.Unavailable, "read node %s: %v", id, err)
		}
		var kvs []*mvccpb.KeyValue
		for _, r := range resp.Responses[:4] {
			kvs = append(kvs, r.GetResponseRange().Kvs...)
		}
		recKVs := resp.Responses[0].GetResponseRange().Kvs
		if len(recKVs) != 1 {
			return nil, false, status.Errorf(codes.NotFound, "node %s: no such node in region %s", id, c.meta.Region)
		}
		nv := store.DecodeNodes(kvs)[id]
		if nv == nil || nv.Rec == nil {
			return nil, false, status.Errorf(codes.Internal, "node %s: its record does not decode", id)
		}
		hs := newHealthState()
		for _, kv := range resp.Responses[4].GetResponseRange().Kvs {
			if _, err := hs.fold(string(kv.Key), kv.Value, kv.ModRevision); err != nil {
				return nil, false, status.Errorf(codes.Internal, "node %s: %v", id, err)
			}
		}
		healthWas := nv.Health
		if write, err := edit(nv.Rec, &nv.Health); err != nil {
			return nil, false, err
		} else if !write {
			return c.nodeProto(id, nv), false, nil
		}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", recKVs[0].ModRevision)}
		ops := []clientv3.Op{clientv3.OpPut(key, store.MustJSON(nv.Rec))}
		if !reflect.DeepEqual(healthWas, nv.Health) {
			nh := hs.node(id)
			nh.rec, nh.rev, nh.changed = nv.Health, nv.HealthRev, true
			if _, in := hs.set.Nodes[id]; in != (nv.Health.Quarantine != nil) {
				if nv.Health.Quarantine == nil {
					delete(hs.set.Nodes, id)
				} else {
					if hs.set.Nodes == nil {
						hs.set.Nodes = map[string]int64{}
					}
					hs.set.Nodes[id] = nv.Health.Quarantine.SinceMs
				}
				hs.setMod = true
			}
			cmps, ops = hs.writes(cmps, ops)
		}
		put, err := c.cli.Txn(cctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return nil, false, status.Errorf(codes.Unavailable, "write node %s: %v", id, err)
		}
		if put.Succeeded {
			// Admission's "fits no node" summary leaves quarantined
			// nodes out.
			c.refreshCapacityAfter(ctx, put.Header.Revision)
			return c.nodeProto(id, nv), true, nil
		}
	}
	return nil, false, status.Errorf(codes.Aborted, "node %s: its record kept changing; retry", id)
}
