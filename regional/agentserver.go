package regional

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/aclstore"
	"apiary.dev/apiary/regional/store"
)

// agentServer serves AgentService on every coordinator. Registration and
// heartbeats touch only the node's keys; reports are compared writes on the
// task (attempt, node epoch) and the node's alive key, so a coordinator that
// does not own the shards may commit them.
type agentServer struct {
	apiaryv1.UnimplementedAgentServiceServer
	c *Coordinator
}

var (
	nodeIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	// registrationIDRE: an agent's random id for one registration and its
	// retries (RegisterNodeRequest.registration_id).
	registrationIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	labelKeyRE       = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?$`)
)

// checkNodeID is INVALID_ARGUMENT naming node_id unless id is a valid node
// id.
func checkNodeID(id string) error {
	if !nodeIDRE.MatchString(id) {
		return status.Errorf(codes.InvalidArgument, "node_id: must match %s", nodeIDRE)
	}
	return nil
}

func (s *agentServer) RegisterNode(ctx context.Context, req *apiaryv1.RegisterNodeRequest) (*apiaryv1.RegisterNodeResponse, error) {
	c := s.c
	if err := checkNodeID(req.GetNodeId()); err != nil {
		return nil, err
	}
	if err := checkDatasets(req.GetDatasets()); err != nil {
		return nil, err
	}
	cp := req.GetCapacity()
	if id := req.GetRegistrationId(); id != "" && !registrationIDRE.MatchString(id) {
		return nil, status.Errorf(codes.InvalidArgument, "registration_id: must match %s", registrationIDRE)
	}
	if cp.GetCpuMillis() <= 0 || cp.GetMemoryMb() <= 0 || cp.GetGpus() < 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity: cpu_millis and memory_mb must be > 0, gpus >= 0")
	}
	if req.GetMaxTasks() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_tasks: must be >= 0")
	}
	if cp.GetCpuMillis() > 1<<30 || cp.GetMemoryMb() > 1<<40 || cp.GetGpus() > 1024 || cp.GetGpuMilli() != 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity: cpu_millis <= 2^30, memory_mb <= 2^40, gpus <= 1024, gpu_milli must be 0 (a node offers whole GPUs)")
	}
	if len(req.GetLabels()) > 64 {
		return nil, status.Error(codes.InvalidArgument, "labels: at most 64")
	}
	for k, v := range req.GetLabels() {
		if !labelKeyRE.MatchString(k) {
			return nil, status.Errorf(codes.InvalidArgument, "labels: key %q must match %s", k, labelKeyRE)
		}
		if strings.EqualFold(k, placement.JurisdictionLabel) && k != placement.JurisdictionLabel {
			// Sovereignty reads exactly this key: a node that spelled it
			// otherwise would silently carry its region's jurisdiction.
			return nil, status.Errorf(codes.InvalidArgument, "labels: key %q: the jurisdiction label is spelled %q (lower case); the sovereignty filter reads only that key",
				k, placement.JurisdictionLabel)
		}
		if len(v) > 256 || !utf8.ValidString(v) || strings.ContainsAny(v, "\x00\n") {
			return nil, status.Errorf(codes.InvalidArgument, "labels[%s]: value must be valid UTF-8 of at most 256 bytes without NUL or newline", k)
		}
	}
	if len(req.GetGpuModel()) > 128 {
		return nil, status.Error(codes.InvalidArgument, "gpu_model: at most 128 bytes")
	}
	// With ACLs, the join token is checked before anything changes: a
	// node refused here keeps its current epoch (if any).
	var join *aclstore.Join
	if c.cfg.ACL {
		var err error
		if join, err = c.checkJoin(ctx, req); err != nil {
			return nil, err
		}
	}
	// The lease and heartbeat interval are sized for the fleet
	// (heartbeats.go); an agent keeps them for this epoch.
	hbInterval, leaseTTL := c.heartbeatTiming()
	ttl := int64(leaseTTL.Seconds())
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	alive := store.KeyNodeAlive(req.GetNodeId())
	// The alive key's value is the registration id that created the epoch
	// (the node id when the agent sent none).
	regID := req.GetRegistrationId()
	aliveValue := cmp.Or(regID, req.GetNodeId())
	old, err := c.cli.Get(cctx, alive)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "register: %v", err)
	}
	var epoch int64
	var lease clientv3.LeaseID
	if regID != "" && len(old.Kvs) == 1 && old.Kvs[0].Lease != 0 && string(old.Kvs[0].Value) == regID {
		// A retry of a registration that committed: keep its epoch (ending
		// it would make the node's loss and a new epoch out of one slow
		// answer, which feeds a registration storm). The lease is renewed
		// now (the agent's first heartbeat comes an interval after this
		// answer, however long the first call took), and the renewal's TTL
		// is the one the epoch was granted. A lease gone meanwhile: a new
		// epoch, as for any other registration.
		ka, err := c.cli.KeepAliveOnce(cctx, clientv3.LeaseID(old.Kvs[0].Lease))
		switch {
		case err == nil && ka.TTL > 0:
			epoch, lease, ttl = old.Kvs[0].CreateRevision, clientv3.LeaseID(old.Kvs[0].Lease), ka.TTL
			hbInterval = min(hbInterval, time.Duration(ttl)*time.Second/4)
		case err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) && status.Code(err) != codes.NotFound:
			return nil, status.Errorf(codes.Unavailable, "register: renew the kept epoch's lease: %v", err)
		}
	}
	outcome := "kept"
	if epoch == 0 {
		outcome = "new_epoch"
		if epoch, lease, join, err = c.newNodeEpoch(ctx, cctx, req, aliveValue, old, ttl, join); err != nil {
			return nil, err
		}
	}
	if join != nil && join.Binds {
		c.log.Info("join token bound to node", "node", req.GetNodeId(), "accessor", join.Accessor)
	}
	labels := req.GetLabels()
	if j, ok := labels[placement.JurisdictionLabel]; ok && j != strings.ToLower(j) {
		// Jurisdictions are lower case (job specs are normalised alike).
		labels = maps.Clone(labels)
		labels[placement.JurisdictionLabel] = strings.ToLower(j)
	}
	rec := store.NodeRecord{ID: req.GetNodeId(), Labels: labels, Capacity: cp, GPUModel: req.GetGpuModel(),
		MaxTasks: req.GetMaxTasks(), Epoch: epoch, LeaseID: int64(lease), RegisteredMs: time.Now().UnixMilli(),
		Datasets: datasetMap(req.GetDatasets())}
	usage := store.KeyNodeUsage(req.GetNodeId())
	// An operator's quarantine, drain and eligibility outlive the node's
	// epochs: carry them over
	// from the record being replaced, compared on its ModRevision so that a
	// quarantine or release committed meanwhile is not overwritten.
	var regRev int64 // the registration's revision
	for i := 0; ; i++ {
		prev, err := c.cli.Get(cctx, store.KeyNode(req.GetNodeId()))
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "register: %v", err)
		}
		var prevRev int64
		if len(prev.Kvs) == 1 {
			prevRev = prev.Kvs[0].ModRevision
			var old store.NodeRecord
			decoded := json.Unmarshal(prev.Kvs[0].Value, &old) == nil
			if decoded && old.Epoch == epoch {
				// A kept epoch whose record the first call wrote: it
				// stands (rewriting it would drop outputs recorded since).
				regRev = prevRev
				break
			}
			if decoded {
				rec.Quarantined, rec.QuarantineReason = old.Quarantined, old.QuarantineReason
				rec.QuarantinedBy, rec.QuarantinedMs = old.QuarantinedBy, old.QuarantinedMs
				rec.Ineligible = old.Ineligible
				if old.Draining && old.DrainBy != store.DrainByAgent {
					// An operator's drain outlives the agent's restarts; the
					// agent's own shutdown drain ends with that run.
					rec.Draining, rec.DrainDeadlineMs, rec.DrainBy = true, old.DrainDeadlineMs, old.DrainBy
				}
			}
		}
		resp, err := c.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(alive), "=", epoch),
			clientv3.Compare(clientv3.ModRevision(store.KeyNode(req.GetNodeId())), "=", prevRev)).
			Then(clientv3.OpPut(store.KeyNode(req.GetNodeId()), store.MustJSON(rec)),
				// Outputs recorded for earlier epochs: the agent's scan
				// (rec.Datasets) says what is still there.
				clientv3.OpDelete(store.PrefNodeOutputs(req.GetNodeId()), clientv3.WithPrefix()),
				clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(usage), "=", 0)},
					[]clientv3.Op{clientv3.OpPut(usage, store.MustJSON(store.UsageRecord{}))}, nil)).
			Else(clientv3.OpGet(alive)).Commit()
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "register: %v", err)
		}
		if resp.Succeeded {
			regRev = resp.Header.Revision
			break
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) != 1 || kvs[0].CreateRevision != epoch {
			// This epoch already ended (as before: the agent hears so on
			// its first heartbeat and registers again).
			break
		}
		if i >= 3 {
			return nil, status.Errorf(codes.Aborted, "register: node %s changed concurrently", req.GetNodeId())
		}
	}
	c.metrics.NodeRegistrations.WithLabelValues(outcome).Inc()
	c.log.Info("node registered", "node", rec.ID, "epoch", epoch, "outcome", outcome, "labels", rec.Labels)
	c.beats.note(rec.ID, epoch, time.Now(), leaseTTL) // a registration is the epoch's first sign of life
	// Admission judges "fits no node" from the capacity summary: include
	// this node before the agent hears it is registered.
	c.refreshCapacityAfter(ctx, regRev)
	return &apiaryv1.RegisterNodeResponse{NodeEpoch: epoch, LeaseTtlMs: ttl * 1000,
		HeartbeatIntervalMs: hbInterval.Milliseconds(), Region: c.meta.Region, LanJoin: c.lanJoin()}, nil
}

// newNodeEpoch ends the node's earlier epoch (old: its alive key as read)
// and starts a new one: a lease of ttl seconds and the alive key, valued
// aliveValue, created under it in one Txn (with join's compares and binding,
// re-checked if the token changed meanwhile). The epoch is that Txn's
// revision. It returns the join as last checked. Errors: UNAVAILABLE (etcd),
// ABORTED (the node registered concurrently 4 times), or checkJoin's.
func (c *Coordinator) newNodeEpoch(ctx, cctx context.Context, req *apiaryv1.RegisterNodeRequest, aliveValue string,
	old *clientv3.GetResponse, ttl int64, join *aclstore.Join) (int64, clientv3.LeaseID, *aclstore.Join, error) {
	alive := store.KeyNodeAlive(req.GetNodeId())
	// End any earlier epoch: revoking its lease deletes its alive key, which
	// the shard owner sees as node loss (its tasks are reclaimed) and which
	// fails every later compare of that epoch.
	if len(old.Kvs) == 1 && old.Kvs[0].Lease != 0 {
		if _, err := c.cli.Revoke(cctx, clientv3.LeaseID(old.Kvs[0].Lease)); err != nil && status.Code(err) != codes.NotFound {
			c.log.Warn("revoke previous node lease", "node", req.GetNodeId(), "err", err)
		}
	}
	lease, err := c.cli.Grant(cctx, ttl)
	if err != nil {
		return 0, 0, join, status.Errorf(codes.Unavailable, "register: grant lease: %v", err)
	}
	for i := 0; ; i++ {
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(alive), "=", 0)}
		ops := []clientv3.Op{clientv3.OpPut(alive, aliveValue, clientv3.WithLease(lease.ID))}
		if join != nil {
			// The join token still as checked (and bound here): a
			// revocation commits either before (this fails) or after
			// (it sees the binding and ends this epoch).
			cmps, ops = append(cmps, join.Cmps...), append(ops, join.Ops...)
		}
		resp, err := c.cli.Txn(cctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(alive)).Commit()
		if err != nil {
			return 0, 0, join, status.Errorf(codes.Unavailable, "register: %v", err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, lease.ID, join, nil
		}
		if i >= 3 {
			_, _ = c.cli.Revoke(cctx, lease.ID)
			return 0, 0, join, status.Errorf(codes.Aborted, "register: node %s is registering concurrently", req.GetNodeId())
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 && kvs[0].Lease != 0 &&
			req.GetRegistrationId() != "" && string(kvs[0].Value) == aliveValue {
			// The same registration, sent again while this call ran, made
			// the epoch first: it is this call's answer too.
			_, _ = c.cli.Revoke(cctx, lease.ID)
			return kvs[0].CreateRevision, clientv3.LeaseID(kvs[0].Lease), join, nil
		} else if len(kvs) == 1 {
			_, _ = c.cli.Revoke(cctx, clientv3.LeaseID(kvs[0].Lease))
		} else if join != nil {
			// No epoch in the way: the join token changed. Check it again.
			if join, err = c.checkJoin(ctx, req); err != nil {
				_, _ = c.cli.Revoke(cctx, lease.ID)
				return 0, 0, join, err
			}
		}
	}
}

// checkJoin is aclstore's CheckJoin of the request's join token, its
// refusals logged and counted.
func (c *Coordinator) checkJoin(ctx context.Context, req *apiaryv1.RegisterNodeRequest) (*aclstore.Join, error) {
	j, err := c.acls.CheckJoin(ctx, req.GetJoinToken(), req.GetNodeId())
	var d *aclstore.Denial
	if errors.As(err, &d) {
		return nil, c.aclDeny(ctx, apiaryv1.AgentService_RegisterNode_FullMethodName, d)
	}
	return j, err
}

// nodeLease checks that (node, epoch) is current and returns its lease.
func (c *Coordinator) nodeLease(ctx context.Context, nodeID string, epoch int64) (clientv3.LeaseID, error) {
	resp, err := c.cli.Get(ctx, store.KeyNodeAlive(nodeID))
	if err != nil {
		return 0, status.Errorf(codes.Unavailable, "read node: %v", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != epoch {
		return 0, status.Errorf(codes.FailedPrecondition, "node %s epoch %d is gone; re-register", nodeID, epoch)
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease), nil
}

func (s *agentServer) Heartbeat(ctx context.Context, req *apiaryv1.HeartbeatRequest) (*apiaryv1.HeartbeatResponse, error) {
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	lease, draining, drainMs, err := s.c.heartbeatLease(cctx, req.GetNodeId(), req.GetNodeEpoch())
	if err != nil {
		return nil, err
	}
	ka, err := s.c.cli.KeepAliveOnce(cctx, lease)
	if err != nil {
		if status.Code(err) == codes.NotFound || err.Error() == "etcdserver: requested lease not found" {
			return nil, status.Errorf(codes.FailedPrecondition, "node %s epoch %d: lease expired; re-register", req.GetNodeId(), req.GetNodeEpoch())
		}
		return nil, status.Errorf(codes.Unavailable, "heartbeat: %v", err)
	}
	// The fleet's interval as it is now, within this epoch's lease: a node
	// that registered while the fleet was small slows down as it grows
	// (Nomad returns a new TTL with every heartbeat alike).
	interval, _ := s.c.heartbeatTiming()
	s.c.beats.note(req.GetNodeId(), req.GetNodeEpoch(), time.Now(), time.Duration(ka.TTL)*time.Second)
	if req.GetDatasetsChanged() {
		if err := checkDatasets(req.GetDatasets()); err != nil {
			// The lease is renewed all the same: a bad list must not cost
			// the node its epoch. The stored list stays as it was.
			s.c.log.Warn("heartbeat's datasets refused; the stored list is kept", "node", req.GetNodeId(), "err", err)
		} else if err := s.c.updateDatasets(cctx, req.GetNodeId(), req.GetNodeEpoch(), req.GetDatasets()); err != nil {
			// The lease was renewed; the agent sends the list again.
			return nil, status.Errorf(codes.Unavailable, "store datasets: %v", err)
		}
	}
	out := &apiaryv1.HeartbeatResponse{LeaseTtlMs: ka.TTL * 1000,
		HeartbeatIntervalMs: min(interval, time.Duration(ka.TTL)*time.Second/4).Milliseconds()}
	if draining {
		out.DrainDeadlineMs = max(drainMs, 1)
	}
	return out, nil
}

// heartbeatLease finds the lease of the node's epoch to renew, and any
// drain the agent must apply: from the node index (the scheduling loop's
// watch cache; no etcd read) when it holds that epoch, else from one read
// of the alive key and the node record. The index may lag by the watch's
// delay, which is safe: an epoch that ended since has its lease revoked,
// and the renewal of a revoked lease fails (the agent registers again); a
// drain set since reaches the agent with a later beat. A FailedPrecondition
// error says the epoch is gone.
func (c *Coordinator) heartbeatLease(ctx context.Context, id string, epoch int64) (lease clientv3.LeaseID, draining bool, drainMs int64, err error) {
	if v, ok := c.nodes.Get(id); ok && v.Rec != nil && v.Alive == epoch && v.Rec.Epoch == epoch && v.Rec.LeaseID != 0 {
		return clientv3.LeaseID(v.Rec.LeaseID), v.Rec.Draining, v.Rec.DrainDeadlineMs, nil
	}
	resp, err := c.cli.Txn(ctx).Then(clientv3.OpGet(store.KeyNodeAlive(id)), clientv3.OpGet(store.KeyNode(id))).Commit()
	if err != nil {
		return 0, false, 0, status.Errorf(codes.Unavailable, "read node: %v", err)
	}
	alive := resp.Responses[0].GetResponseRange().Kvs
	if len(alive) == 0 || alive[0].CreateRevision != epoch {
		return 0, false, 0, status.Errorf(codes.FailedPrecondition, "node %s epoch %d is gone; re-register", id, epoch)
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
		var rec store.NodeRecord
		if json.Unmarshal(kvs[0].Value, &rec) == nil && rec.Draining {
			draining, drainMs = true, rec.DrainDeadlineMs
		}
	}
	return clientv3.LeaseID(alive[0].Lease), draining, drainMs, nil
}

// maxNodeDatasets bounds the datasets one node reports; maxDatasetBytes
// the size of one (1 PiB: a larger claim is a bug or a lie, and would
// dwarf every real copy in the locality score).
const (
	maxNodeDatasets = 10000
	maxDatasetBytes = 1 << 50
)

// checkDatasets validates a node's reported datasets (the field rules of a
// job's datasets: a name of 1-512 printable characters, a size >= 0; at
// most maxNodeDatasets, no name twice).
func checkDatasets(ds []*apiaryv1.LocalDataset) error {
	if len(ds) > maxNodeDatasets {
		return status.Errorf(codes.InvalidArgument, "datasets: at most %d (got %d)", maxNodeDatasets, len(ds))
	}
	seen := make(map[string]bool, len(ds))
	for i, d := range ds {
		n := d.GetName()
		switch {
		case !jobspec.ValidDatasetName(n):
			return status.Errorf(codes.InvalidArgument, "datasets[%d].name: must be 1-512 printable characters", i)
		case d.GetSizeBytes() < 0 || d.GetSizeBytes() > maxDatasetBytes:
			return status.Errorf(codes.InvalidArgument, "datasets[%d].size_bytes: must be between 0 and 2^50 (got %d)", i, d.GetSizeBytes())
		case seen[n]:
			return status.Errorf(codes.InvalidArgument, "datasets[%d].name: %q is listed twice", i, n)
		}
		seen[n] = true
	}
	return nil
}

// datasetMap is a node's datasets as its record stores them (nil for none).
func datasetMap(ds []*apiaryv1.LocalDataset) map[string]int64 {
	if len(ds) == 0 {
		return nil
	}
	m := make(map[string]int64, len(ds))
	for _, d := range ds {
		m[d.GetName()] = d.GetSizeBytes()
	}
	return m
}

// updateDatasets replaces the datasets in the record of node epoch epoch,
// compared on the record's ModRevision and the epoch's alive key (a record
// of another epoch is left alone: that epoch reports its own).
func (c *Coordinator) updateDatasets(ctx context.Context, node string, epoch int64, ds []*apiaryv1.LocalDataset) error {
	for range 3 {
		resp, err := c.cli.Get(ctx, store.KeyNode(node))
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 {
			return nil
		}
		var rec store.NodeRecord
		if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil || rec.Epoch != epoch {
			return err
		}
		rec.Datasets = datasetMap(ds)
		tr, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(store.KeyNode(node)), "=", resp.Kvs[0].ModRevision),
			clientv3.Compare(clientv3.CreateRevision(store.KeyNodeAlive(node)), "=", epoch)).
			Then(clientv3.OpPut(store.KeyNode(node), store.MustJSON(rec))).Commit()
		if err != nil || tr.Succeeded {
			return err
		}
	}
	return errors.New("the node record kept changing")
}

// StreamAssignments sends the node's current assignments, then every new one,
// from a watch on /apiary/assign/<node>/. The fencing token of an assignment
// is its key's CreateRevision (the revision of the plan that dispatched it)
// under the job's failover epoch (store.FencingToken).
func (s *agentServer) StreamAssignments(req *apiaryv1.StreamAssignmentsRequest, stream apiaryv1.AgentService_StreamAssignmentsServer) error {
	c := s.c
	ctx := stream.Context()
	cctx, cancel := store.EtcdCtx(ctx)
	if _, err := c.nodeLease(cctx, req.GetNodeId(), req.GetNodeEpoch()); err != nil {
		cancel()
		return err
	}
	// Subscribe before the read: every put after it reaches sub, and the
	// read holds everything before (assignhub.go).
	sub, err := c.assignHub.subscribe(req.GetNodeId())
	if err != nil {
		cancel()
		return status.Errorf(codes.Unavailable, "%v; reconnect", err)
	}
	defer c.assignHub.unsubscribe(sub)
	resp, err := c.cli.Get(cctx, store.PrefNodeAssign(req.GetNodeId()), clientv3.WithPrefix())
	cancel()
	if err != nil {
		return status.Errorf(codes.Unavailable, "read assignments: %v", err)
	}
	send := func(value []byte, createRev int64) error {
		var a apiaryv1.Assignment
		if err := proto.Unmarshal(value, &a); err != nil {
			return status.Errorf(codes.Internal, "decode assignment: %v", err)
		}
		if a.NodeEpoch != req.GetNodeEpoch() {
			return nil
		}
		a.FencingToken = store.FencingToken(a.GetFailoverEpoch(), createRev)
		if err := c.withSecrets(ctx, &a); err != nil {
			if errors.Is(err, errDispatchRetry) {
				return status.Errorf(codes.Unavailable, "assignment %s/%d: %v; reconnect", a.GetJobId(), a.GetTaskIndex(), err)
			}
			c.failDispatch(req.GetNodeId(), &a, err)
			return nil
		}
		span := c.dispatchSpan(&a)
		err := stream.Send(&apiaryv1.StreamAssignmentsResponse{Assignment: &a})
		if span != nil {
			span.SetAttributes(telemetry.AttrNodeID.String(req.GetNodeId()))
			telemetry.RecordError(span, err)
			span.End()
		}
		return err
	}
	for _, kv := range resp.Kvs {
		if err := send(kv.Value, kv.CreateRevision); err != nil {
			return err
		}
	}
	read := resp.Header.Revision
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	// The node's alive key: a single-key watch (c.watchCli, not the
	// in-process c.cli; see its doc).
	aw := c.watchCli.Watch(wctx, store.KeyNodeAlive(req.GetNodeId()), clientv3.WithRev(read+1))
	for {
		select {
		case <-ctx.Done():
			return nil
		case wr, ok := <-aw:
			if !ok || wr.Err() != nil {
				return status.Error(codes.Unavailable, "watch interrupted; reconnect")
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != req.GetNodeEpoch() {
					return status.Errorf(codes.FailedPrecondition, "node %s epoch %d ended; re-register", req.GetNodeId(), req.GetNodeEpoch())
				}
			}
		case <-sub.ready:
			evs, dropped := sub.take()
			for _, ev := range evs {
				if ev.modRev <= read {
					continue // in the read already
				}
				if err := send(ev.value, ev.createRev); err != nil {
					return err
				}
			}
			if dropped != nil {
				return status.Errorf(codes.Unavailable, "%v; reconnect", dropped)
			}
		}
	}
}

func (s *agentServer) ReportTaskStatus(ctx context.Context, req *apiaryv1.ReportTaskStatusRequest) (*apiaryv1.ReportTaskStatusResponse, error) {
	if req.GetKind() == apiaryv1.ReportKind_REPORT_KIND_UNSPECIFIED {
		return nil, status.Error(codes.InvalidArgument, "kind: is required")
	}
	if _, err := s.c.checkJobID(req.GetJobId()); err != nil {
		return nil, err
	}
	// Keep at most maxTailBytes of each stream (the end), whatever the agent
	// sent, so one report can never outgrow an etcd request.
	req.StdoutTail, req.StderrTail = capTail(req.GetStdoutTail()), capTail(req.GetStderrTail())
	if len(req.GetError()) > maxTailBytes {
		req.Error = req.GetError()[:maxTailBytes]
	}
	it := &reportItem{req: req, done: make(chan *apiaryv1.ReportTaskStatusResponse, 1)}
	if err := s.c.reports.submit(ctx, it); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	select {
	case r := <-it.done:
		if it.err != nil {
			return nil, reportStatus(it.err)
		}
		return r, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// reportStatus is the gRPC status of a report that did not commit: ABORTED
// when its task or node kept changing (the agent retries), UNAVAILABLE when
// etcd failed.
func reportStatus(err error) error {
	if errors.Is(err, errReportContended) {
		return status.Error(codes.Aborted, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}
