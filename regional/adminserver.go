package regional

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/hashicorp/serf/serf"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/shards"
)

// adminServer serves AdminService: node and region views for operators.
// ListNodes lists the region's nodes, GetRegionInfo describes the region
// (members, scheduler, etcd leader, counts, state size), ListRegions
// answers from the coordinator's own view (see there), and SaveSnapshot
// streams etcd's snapshot (snapshot.go).
type adminServer struct {
	apiaryv1.UnimplementedAdminServiceServer
	c *Coordinator
}

func (s *adminServer) ListNodes(ctx context.Context, _ *apiaryv1.ListNodesRequest) (*apiaryv1.ListNodesResponse, error) {
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := s.c.cli.Get(cctx, store.PrefNodes, clientv3.WithPrefix())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "list nodes: %v", err)
	}
	out := &apiaryv1.ListNodesResponse{}
	for id, nv := range store.DecodeNodes(resp.Kvs) {
		if nv.Rec == nil {
			continue
		}
		out.Nodes = append(out.Nodes, s.c.nodeProto(id, nv))
	}
	sort.Slice(out.Nodes, func(a, b int) bool { return out.Nodes[a].Id < out.Nodes[b].Id })
	return out, nil
}

// nodeProto is the API view of a node with a record (nv.rec not nil).
func (c *Coordinator) nodeProto(id string, nv *store.NodeView) *apiaryv1.Node {
	r := nv.Rec
	n := &apiaryv1.Node{Id: id, Labels: r.Labels, Capacity: r.Capacity, Epoch: r.Epoch, GpuModel: r.GPUModel,
		MaxTasks: r.MaxTasks, RegisteredTimeMs: r.RegisteredMs, Quarantined: r.Quarantined,
		QuarantineReason: r.QuarantineReason, QuarantinedBy: r.QuarantinedBy, QuarantinedTimeMs: r.QuarantinedMs,
		Draining: r.Draining, DrainDeadlineMs: r.DrainDeadlineMs, Ineligible: r.Ineligible,
		Status: apiaryv1.NodeStatus_NODE_STATUS_DOWN, Allocated: &apiaryv1.Resources{},
		Region: c.meta.Region}
	ds := nv.Datasets()
	for _, name := range slices.Sorted(maps.Keys(ds)) {
		n.Datasets = append(n.Datasets, &apiaryv1.LocalDataset{Name: name, SizeBytes: ds[name]})
	}
	if h := nv.Health; nv.AutoQuarantined() {
		q := h.Quarantine
		n.Quarantined, n.QuarantineReason, n.QuarantinedBy, n.QuarantinedTimeMs = true, q.Reason, autoQuarantineBy, q.SinceMs
		n.QuarantineAutomatic, n.QuarantineProbeTimeMs = true, q.ProbeAtMs
	}
	n.QuarantineStrikes = nv.Health.Strikes
	tot := nv.Health.Totals(c.cfg.Quarantine, time.Now().UnixMilli())
	n.RecentAttempts, n.RecentFailures = int32(tot.Attempts), int32(tot.Failures)
	if nv.Ready() {
		n.Status = apiaryv1.NodeStatus_NODE_STATUS_READY
		if u := nv.Usage; u != nil && u.Epoch == r.Epoch {
			n.Allocated = &apiaryv1.Resources{CpuMillis: u.CPUMillis, MemoryMb: u.MemoryMiB, Gpus: u.GPUs, GpuMilli: u.GPUMilli}
			n.RunningTasks = u.Tasks
			n.Limits = &apiaryv1.ResourceLimits{CpuMillis: u.LimitCPUMillis, MemoryMb: u.LimitMemoryMiB}
		}
	}
	return n
}

// etcdLeaderByClient is the etcd leader's member name as a coordinator
// without an embedded member (--etcd-endpoints) learns it: the first
// endpoint that answers Status names the leader's id, MemberList its name
// ("" if none answers).
func (c *Coordinator) etcdLeaderByClient(ctx context.Context) string {
	for _, ep := range c.cli.Endpoints() {
		st, err := c.cli.Status(ctx, ep)
		if err != nil || st.Leader == 0 {
			continue
		}
		ml, err := c.cli.MemberList(ctx)
		if err != nil {
			return ""
		}
		for _, m := range ml.Members {
			if m.ID == st.Leader {
				return m.Name
			}
		}
		return ""
	}
	return ""
}

func (s *adminServer) GetRegionInfo(ctx context.Context, _ *apiaryv1.GetRegionInfoRequest) (*apiaryv1.GetRegionInfoResponse, error) {
	c := s.c
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	out := &apiaryv1.GetRegionInfoResponse{Region: c.meta.Region, Jurisdiction: c.meta.Jurisdiction,
		Labels: c.meta.Labels, ShardCount: int32(c.meta.ShardCount)}
	owned, err := c.shardOwners(cctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "region info: %v", err)
	}
	perCoord := owned.PerMember()
	for _, o := range owned.Owners {
		out.SchedulerEpoch = max(out.SchedulerEpoch, int64(o.Epoch))
	}
	for id, n := range perCoord {
		if best := perCoord[out.Scheduler]; n > best || (n == best && id < out.Scheduler) {
			out.Scheduler = id
		}
	}
	if e := c.etcd; e != nil && e.Server != nil {
		if lead := e.Server.Leader(); lead != 0 {
			if m := e.Server.Cluster().Member(lead); m != nil {
				out.EtcdLeader = m.Name
			}
		}
	} else {
		out.EtcdLeader = c.etcdLeaderByClient(cctx)
	}
	// Pending tasks and node counts come from the job and node indexes
	// (the scheduling loop's watch cache) once they have applied every
	// write committed before this call. When the job index lags by more
	// than jobsIndexWait, pending_tasks is its count at its own revision
	// (pending_revision says which; reading every task record instead
	// costs the region's size per call, and timed out at a million
	// records), and the node counts come from a keys-only read of the node
	// keys (O(nodes)).
	current, err := c.jobsCurrent(ctx, "region info")
	if err != nil {
		return nil, err
	}
	ops := []clientv3.Op{clientv3.OpGet(store.PrefMembers, clientv3.WithPrefix())}
	if !current {
		ops = append(ops, clientv3.OpGet(store.PrefNodes, clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	}
	resp, err := c.cli.Txn(cctx).Then(ops...).Commit()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "region info: %v", err)
	}
	out.Revision = resp.Header.Revision
	c.stateSize(ctx, out)
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var m store.MemberRecord
		if json.Unmarshal(kv.Value, &m) != nil {
			continue
		}
		co := &apiaryv1.Coordinator{Id: m.ID, ApiAddr: m.APIAddr, Scheduler: perCoord[m.ID] > 0, ShardsOwned: int32(perCoord[m.ID])}
		out.Coordinators = append(out.Coordinators, co)
	}
	out.PendingRevision = c.jobs.EachPending(func(_ *store.JobRecord, n int32) { out.PendingTasks += n })
	switch {
	case out.PendingRevision == 0:
		out.PendingRevision = -1 // not loaded (or reset since jobsCurrent): unknown
	case current:
		// The index had reached etcd's revision read before the Txn.
		out.PendingRevision = max(out.PendingRevision, out.Revision)
	}
	if current {
		c.nodes.Each(func(_ string, v *store.NodeView) {
			if v.Alive != 0 {
				out.NodesReady++
			}
			if v.Rec != nil {
				out.NodesRegistered++
			}
		})
		return out, nil
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		switch _, kind, ok := store.NodeKeyKind(string(kv.Key)); {
		case ok && kind == "alive":
			out.NodesReady++
		case ok && kind == "record":
			out.NodesRegistered++
		}
	}
	return out, nil
}

// ListRegions answers from this coordinator's view, so that `apiary region
// list` works against a coordinator too. In a WAN pool (--wan-bind or
// --wan-join) it lists every region whose coordinators are in the pool, as
// the router does, except that a coordinator does not probe the others'
// APIs: an alive member counts as answering. Outside a pool it lists its own
// region: itself and the coordinators that hold an etcd session (member
// records). Each coordinator's shards_owned is what its WAN tags say (-1 for
// one that publishes none); outside a pool, the others' counts come from the
// shard owners view (-1 if it cannot be read). Errors: UNAVAILABLE when etcd
// cannot be read (outside a pool).
func (s *adminServer) ListRegions(ctx context.Context, _ *apiaryv1.ListRegionsRequest) (*apiaryv1.ListRegionsResponse, error) {
	c := s.c
	c.wan.mu.Lock()
	sf := c.wan.serf
	c.wan.mu.Unlock()
	var members []serf.Member
	if sf != nil {
		members = sf.Members()
	} else {
		own, err := c.wanTags()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "list regions: %v", err)
		}
		members = append(members, serf.Member{Name: c.cfg.ID, Tags: own, Status: serf.StatusAlive})
		cctx, cancel := store.EtcdCtx(ctx)
		defer cancel()
		resp, err := c.cli.Get(cctx, store.PrefMembers, clientv3.WithPrefix())
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "list regions: read the region's members: %v", err)
		}
		var perCoord map[string]int // nil: unknown (-1 below)
		if owned, err := c.shardOwners(cctx); err == nil {
			perCoord = owned.PerMember()
		}
		for _, kv := range resp.Kvs {
			var m store.MemberRecord
			if json.Unmarshal(kv.Value, &m) != nil || m.ID == c.cfg.ID {
				continue
			}
			n := -1
			if perCoord != nil {
				n = perCoord[m.ID]
			}
			tags, err := federation.CoordinatorTags{Region: c.meta.Region, ID: m.ID, Jurisdiction: c.meta.Jurisdiction,
				Labels: c.meta.Labels, APIAddr: m.APIAddr, ShardsOwned: n}.Encode()
			if err != nil {
				continue
			}
			members = append(members, serf.Member{Name: m.ID, Tags: tags, Status: serf.StatusAlive})
		}
	}
	out := &apiaryv1.ListRegionsResponse{}
	for _, reg := range federation.BuildRegions(members, func(string) bool { return true }) {
		out.Regions = append(out.Regions, reg.Summary())
	}
	return out, nil
}

// shardOwners reads every shard's owner (a linearizable range read, not
// the owner part's watch view: without an etcd quorum the answer is
// UNAVAILABLE rather than a stale view).
func (c *Coordinator) shardOwners(ctx context.Context) (shards.Snapshot, error) {
	return shards.ReadOwners(ctx, c.cli, c.shardLayout())
}

// ListShards answers from a read of the owner keys and the scheduling
// loop's cache (every coordinator keeps one).
func (s *adminServer) ListShards(ctx context.Context, _ *apiaryv1.ListShardsRequest) (*apiaryv1.ListShardsResponse, error) {
	c := s.c
	stats := c.shardStats.Load()
	if stats == nil {
		return nil, status.Errorf(codes.Unavailable, "list shards: coordinator %s has not loaded its cache yet; retry", c.cfg.ID)
	}
	cctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	owned, err := c.shardOwners(cctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "list shards: %v", err)
	}
	out := &apiaryv1.ListShardsResponse{ShardCount: int32(c.meta.ShardCount), Revision: owned.Rev, Coordinator: c.cfg.ID}
	for sh := 0; sh < c.meta.ShardCount; sh++ {
		r := &apiaryv1.Shard{Shard: int32(sh)}
		if o, ok := owned.Owners[sh]; ok {
			r.Owner, r.Epoch = o.Member, int64(o.Epoch)
		}
		if sh < len(*stats) {
			st := (*stats)[sh]
			r.PendingTasks, r.RunningTasks, r.LastPlanMs = int32(st.Pending), int32(st.Running), st.LastPlanMs
		}
		out.Shards = append(out.Shards, r)
	}
	return out, nil
}
