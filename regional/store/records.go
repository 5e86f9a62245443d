package store

import (
	"encoding/json"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/regional/nodehealth"
)

// JobRecord is /apiary/jobs/<s>/<jobID>. Its state is never stored: it is
// derived from the tasks (taskstate.JobState).
type JobRecord struct {
	ID              string            `json:"id"`
	Region          string            `json:"region"`
	Shard           int               `json:"shard"`
	Spec            *apiaryv1.JobSpec `json:"spec"`
	SubmitMs        int64             `json:"submit_ms"`
	ClientID        string            `json:"client_id,omitempty"`
	RequestID       string            `json:"request_id,omitempty"`
	PayloadHash     string            `json:"hash,omitempty"`
	Traceparent     string            `json:"traceparent,omitempty"`
	TaskCount       int32             `json:"tasks"`
	CancelRequested bool              `json:"cancel,omitempty"`
	// Where is the sovereignty decision resolved at admission
	// (policy.Resolve); the placement filter enforces it. Records written
	// before it existed have none: their spec's jurisdiction is used.
	Where *WhereRecord `json:"where,omitempty"`
	// Failover is the job's failover state (nil: the job never fails
	// over): in its home region its standbys, or why it has none, and,
	// once it moved, where; in the region that activated it, its home and
	// epoch.
	Failover *FailoverRecord `json:"failover,omitempty"`
}

// FailoverRecord is a job's failover state (docs/architecture.md, "Failover
// of accepted jobs").
type FailoverRecord struct {
	// AfterMs: how long the home region must be down before a standby
	// activates the job.
	AfterMs int64 `json:"after_ms,omitempty"`
	// Standbys hold the job's spec, in activation order.
	Standbys []string `json:"standbys,omitempty"`
	// NotEligible says why no region may take the job over (Standbys is
	// then empty and the job never moves).
	NotEligible string `json:"not_eligible,omitempty"`
	// Home is the region that accepted the job; Epoch is 0 there and one
	// more for each move. MovedMs is when this region activated it.
	Home    string `json:"home,omitempty"`
	Epoch   int64  `json:"epoch,omitempty"`
	MovedMs int64  `json:"moved_ms,omitempty"`
	// MovedTo, in a region the job left, is the region that took it over
	// (at MovedEpoch): this region runs nothing of it any more.
	MovedTo    string `json:"moved_to,omitempty"`
	MovedEpoch int64  `json:"moved_epoch,omitempty"`
}

// FailoverEpoch is the epoch a region dispatches the job under (0 for a
// job that never moved, and for a nil record).
func (j *JobRecord) FailoverEpoch() int64 {
	if j == nil || j.Failover == nil {
		return 0
	}
	return j.Failover.Epoch
}

// Moved reports whether the job left this region for another.
func (j *JobRecord) Moved() bool { return j != nil && j.Failover != nil && j.Failover.MovedTo != "" }

// FailoverTokenShift places the failover epoch above the revision in a
// fencing token: token = epoch << 48 + the assignment key's CreateRevision.
// A region's revisions stay below 2^48 (2.8e14 writes), so every token a
// region issues after a move exceeds every token of the region the job
// left, whatever the two regions' revisions (docs/agent.md,
// APIARY_FENCING_TOKEN).
const FailoverTokenShift = 48

// FencingToken composes the token of an assignment dispatched under epoch
// whose key has CreateRevision createRev.
func FencingToken(epoch, createRev int64) int64 { return epoch<<FailoverTokenShift + createRev }

// TokenRevision is the assignment key's CreateRevision within a token.
func TokenRevision(token int64) int64 { return token & (1<<FailoverTokenShift - 1) }

// StandbyRecord is /apiary/failover/standby/<jobID>: another region's job
// held here, not scheduled, until this region activates it.
type StandbyRecord struct {
	ID          string            `json:"id"`
	Home        string            `json:"home"`
	Spec        *apiaryv1.JobSpec `json:"spec"`
	SubmitMs    int64             `json:"submit_ms"`
	ClientID    string            `json:"client_id,omitempty"`
	RequestID   string            `json:"request_id,omitempty"`
	Traceparent string            `json:"traceparent,omitempty"`
	AfterMs     int64             `json:"after_ms"`
	Standbys    []string          `json:"standbys"`
	HomeEpoch   int64             `json:"home_epoch,omitempty"`
	Where       *WhereRecord      `json:"where,omitempty"`
	// StoredMs is when this region wrote the record.
	StoredMs int64 `json:"stored_ms"`
}

// HomeIndexRecord is /apiary/failover/home/<jobID>: a failover job of this
// region whose progress goes to its standbys (written with the job).
type HomeIndexRecord struct {
	Shard int `json:"shard"`
	// Standbys took the job's standby record; progress goes to them.
	Standbys  []string `json:"standbys"`
	TaskCount int32    `json:"tasks"`
	// Unacked are the standbys whose write failed or timed out: one may
	// still have committed it, so they are told the job's end too.
	Unacked []string `json:"unacked,omitempty"`
}

// PendingRecord is /apiary/failover/pending/<jobID>: a failover submission
// whose standby records may exist while its job is not committed. The
// job's commit deletes it and requires it unchanged (so once marked
// abandoned, the job can no longer commit); an abandoned record stays until
// every standby has dropped its record of the job.
type PendingRecord struct {
	Shard int `json:"shard"`
	// Standbys: every region the standby record was sent to.
	Standbys  []string `json:"standbys"`
	CreatedMs int64    `json:"created_ms"`
	// ClientID and RequestID: the submission's idempotency key, if any (a
	// repeat of it supersedes this one, failover.Supersede).
	ClientID  string `json:"client_id,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// Abandoned: the job will never commit; AbandonedMs is when that was
	// decided, Reason why.
	Abandoned   bool   `json:"abandoned,omitempty"`
	AbandonedMs int64  `json:"abandoned_ms,omitempty"`
	Reason      string `json:"reason,omitempty"`
}

// TaskDoneRecord is /apiary/failover/done/<jobID>/<index>: the task's
// completion in the job's home region.
type TaskDoneRecord struct {
	Attempt int32  `json:"attempt"`
	Token   int64  `json:"token"`
	DoneMs  int64  `json:"done_ms,omitempty"`
	Node    string `json:"node,omitempty"`
	StartMs int64  `json:"start_ms,omitempty"`
}

// MovedRecord is /apiary/failover/moved/<jobID> in the region that
// activated a standby job.
type MovedRecord struct {
	Home    string `json:"home"`
	Epoch   int64  `json:"epoch"`
	MovedMs int64  `json:"moved_ms"`
}

// ClaimRecord is /apiary/failover/claimed/<jobID>: this region gave the job
// up to region By, which may activate it.
type ClaimRecord struct {
	By   string `json:"by"`
	AtMs int64  `json:"at_ms"`
}

// ObserveRecord is /apiary/failover/observe/<home>/<coordID>: since when
// (the observer's clock, Unix ms) the coordinator has seen region home down
// in the WAN pool with its probes unanswered.
type ObserveRecord struct {
	DownSinceMs int64 `json:"down_since_ms"`
}

// WhereRecord is where a job may run: any jurisdiction, or only those listed
// (by the policy rule named).
type WhereRecord struct {
	Rule          string   `json:"rule"`
	Any           bool     `json:"any,omitempty"`
	Jurisdictions []string `json:"jurisdictions,omitempty"`
}

// NodeRecord is /apiary/nodes/<nodeID>.
type NodeRecord struct {
	ID       string              `json:"id"`
	Labels   map[string]string   `json:"labels,omitempty"`
	Capacity *apiaryv1.Resources `json:"capacity"`
	// Datasets the node holds locally, name → bytes, as its agent reported
	// them for this epoch (registration, then heartbeats when they change).
	Datasets     map[string]int64 `json:"datasets,omitempty"`
	GPUModel     string           `json:"gpu_model,omitempty"`
	MaxTasks     int32            `json:"max_tasks,omitempty"`
	Epoch        int64            `json:"epoch"`
	LeaseID      int64            `json:"lease"`
	RegisteredMs int64            `json:"registered_ms"`
	// Quarantined nodes get no new placements (their running attempts
	// continue). An operator sets it (AdminService.QuarantineNode) with the
	// reason, who asked and when (Unix ms); registration keeps it.
	Quarantined      bool   `json:"quarantined,omitempty"`
	QuarantineReason string `json:"quarantine_reason,omitempty"`
	QuarantinedBy    string `json:"quarantined_by,omitempty"`
	QuarantinedMs    int64  `json:"quarantined_ms,omitempty"`
	// Draining nodes get no new placements; at DrainDeadlineMs (Unix ms, 0:
	// at once) their agent stops the attempts still running and reports
	// them DRAINED. DrainBy is who asked: an operator (AdminService.
	// DrainNode; kept across registrations) or DrainByAgent (the agent
	// shutting down; cleared when it registers again).
	Draining        bool   `json:"draining,omitempty"`
	DrainDeadlineMs int64  `json:"drain_deadline_ms,omitempty"`
	DrainBy         string `json:"drain_by,omitempty"`
	// Ineligible nodes get no new placements (SetNodeEligibility; kept
	// across registrations).
	Ineligible bool `json:"ineligible,omitempty"`
	// Left is set by Deregister, with the ending of the epoch, when the
	// agent shut down cleanly: the tasks it still held are requeued without
	// charge.
	Left bool `json:"left,omitempty"`
}

// DrainByAgent is NodeRecord.DrainBy for an agent's own shutdown drain.
const DrainByAgent = "agent shutdown"

// noPlacements reports whether the node takes no new placements: an
// operator's quarantine, a drain, or eligibility turned off.
func (r *NodeRecord) noPlacements() bool { return r.Quarantined || r.Draining || r.Ineligible }

// UsageRecord is /apiary/nodes/<nodeID>/usage: the resources allocated on
// the node by committed plans. Its ModRevision is the CAS version a plan
// compares; only shard owners write it.
type UsageRecord struct {
	Epoch     int64 `json:"epoch"`
	CPUMillis int64 `json:"cpu"`
	MemoryMiB int64 `json:"mem"`
	GPUs      int32 `json:"gpus"`
	// GPUMilli is the sum of the node's GPU shares (milli; may exceed
	// 1000 when shares sit on several GPUs).
	GPUMilli int32 `json:"gpu_milli,omitempty"`
	Tasks    int32 `json:"tasks"`
	// LimitCPUMillis and LimitMemoryMiB sum the limits (Resources.limits)
	// of the tasks counted; a task without a limit adds nothing
	// (apiaryv1.Node.limits).
	LimitCPUMillis int64 `json:"lim_cpu,omitempty"`
	LimitMemoryMiB int64 `json:"lim_mem,omitempty"`
}

// AddLimits counts the limits of a task already counted by Add.
func (u *UsageRecord) AddLimits(l *apiaryv1.ResourceLimits) {
	u.LimitCPUMillis += l.GetCpuMillis()
	u.LimitMemoryMiB += l.GetMemoryMb()
}

// add counts one more task holding r.
func (u *UsageRecord) Add(r placement.Resources) {
	u.CPUMillis += r.CPUMillis
	u.MemoryMiB += r.MemoryMiB
	u.GPUs += int32(r.GPUs)
	if r.GPUs == 0 {
		u.GPUMilli += int32(r.GPUMilli)
	}
	u.Tasks++
}

// SecretEnvMarker is the env entry of a stored assignment whose group has
// secret_env: its value is the group index. No variable has this name
// (names match [A-Za-z_][A-Za-z0-9_]*); the streaming coordinator replaces it
// with the opened values before the agent sees the assignment.
const SecretEnvMarker = "apiary.secret_env"

// DedupRecord is /apiary/dedup/<clientID>/<requestID>: the job made for the
// request here, or (JobID empty) the region the request was forwarded to by
// this, its home region (regional/forward.go).
type DedupRecord struct {
	JobID   string `json:"job,omitempty"`
	Hash    string `json:"hash"`
	Forward string `json:"forward,omitempty"`
	// AtMs is when a forward was recorded (Unix ms).
	AtMs int64 `json:"at_ms,omitempty"`
	// Standby: written with a standby record of another region's job
	// (regional/failover PutStandby), before that job committed at its
	// home. It answers a repeat only once the job is activated here; until
	// then it sends the repeat to the job's home region, which alone knows
	// whether the job exists.
	Standby bool `json:"standby,omitempty"`
}

// MetaRecord is /apiary/meta, written once at region creation.
type MetaRecord struct {
	Region       string            `json:"region"`
	Jurisdiction string            `json:"jurisdiction,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	ShardCount   int               `json:"shards"`
}

// MemberRecord is /apiary/members/<coordID>.
type MemberRecord struct {
	ID      string `json:"id"`
	APIAddr string `json:"api_addr"`
	// LANAddr is the coordinator's serf LAN member (host:port; "" without
	// a pool): its peers join it, agents get it in lan_join.
	LANAddr string `json:"lan_addr,omitempty"`
	// APIOnly: the coordinator owns no shards (regional.Config.APIOnly); the
	// others leave it out of the shard assignment.
	APIOnly bool `json:"api_only,omitempty"`
}

// MustJSON encodes a record without HTML escaping (json.Marshal would store
// each '<' of an output tail as six bytes).
func MustJSON(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// NodeView is a node's keys under /apiary/nodes/<id> decoded: the record,
// the alive key's CreateRevision (its current epoch; 0 when the lease is
// gone), and the usage record with its ModRevision (the placement CAS
// version; 0 when there is none). It is the one decoding of node keys: the
// scheduling loop's cache (package scheduler) and every range read
// (DecodeNodes) fold keys in with Apply.
type NodeView struct {
	Rec      *NodeRecord
	Alive    int64
	Usage    *UsageRecord
	UsageRev int64
	// Health is the node's attribution record (zero when it has none) and
	// HealthRev its ModRevision (0: no key).
	Health    nodehealth.Record
	HealthRev int64
	// Outputs are the task outputs recorded for the node, by name, and
	// RecRev the record's ModRevision (a dataset report newer than an
	// output record supersedes it: Datasets).
	Outputs map[string]OutputRecord
	RecRev  int64
}

// OutputRecord is /apiary/nodes/<id>/outputs/<name>: a completed task's
// output the node holds, in bytes, recorded in the completion's Txn for the
// node epoch that ran it.
type OutputRecord struct {
	Epoch int64 `json:"epoch"`
	Bytes int64 `json:"bytes"`
	// Rev is the key's ModRevision (not stored).
	Rev int64 `json:"-"`
}

// Datasets is what the node holds now, name → bytes: its agent's reported
// datasets and the outputs recorded for its current epoch since the record
// was last written (a record written after an output's completion carries
// the agent's scan, which lists the output if it is still on disk; the
// larger size when both name one). Nil for none.
func (n *NodeView) Datasets() map[string]int64 {
	if n.Rec == nil {
		return nil
	}
	if len(n.Outputs) == 0 {
		return n.Rec.Datasets
	}
	out := make(map[string]int64, len(n.Rec.Datasets)+len(n.Outputs))
	for k, v := range n.Rec.Datasets {
		out[k] = v
	}
	for k, o := range n.Outputs {
		if o.Epoch == n.Rec.Epoch && o.Rev > n.RecRev && o.Bytes >= out[k] {
			out[k] = o.Bytes
		}
	}
	return out
}

// AutoQuarantined reports whether the node is quarantined automatically
// (and no operator's quarantine holds it: that one wins and is never
// probed).
func (n *NodeView) AutoQuarantined() bool {
	return n.Health.Quarantine != nil && (n.Rec == nil || !n.Rec.Quarantined)
}

// NoPlacements reports whether the node takes no new placements: its
// record's reasons (noPlacements) or an automatic quarantine (whose
// canary is the placement input's business, the scheduler's nodeSnapshot).
func (n *NodeView) NoPlacements() bool {
	return n.Rec == nil || n.Rec.noPlacements() || n.Health.Quarantine != nil
}

// Ready reports whether the node may take placements: its lease is alive and
// its record is of the same epoch.
func (n *NodeView) Ready() bool { return n.Rec != nil && n.Alive != 0 && n.Alive == n.Rec.Epoch }

// Apply folds one of the node's keys (of the given kind) into the view, or
// its deletion. A usage value older than the one held is ignored. A record or
// usage value that does not decode leaves the view as it was and returns the
// decoding error (naming the key).
func (n *NodeView) Apply(kind NodeKind, kv *mvccpb.KeyValue, deleted bool) error {
	switch kind {
	case NodeRecordKey:
		if deleted {
			n.Rec = nil
			return nil
		}
		var r NodeRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return fmt.Errorf("node record %s: %w", kv.Key, err)
		}
		n.Rec, n.RecRev = &r, kv.ModRevision
	case NodeAliveKey:
		if deleted {
			n.Alive = 0
		} else {
			n.Alive = kv.CreateRevision
		}
	case NodeUsageKey:
		if deleted {
			n.Usage, n.UsageRev = nil, 0
			return nil
		}
		if kv.ModRevision <= n.UsageRev {
			return nil
		}
		var u UsageRecord
		if err := json.Unmarshal(kv.Value, &u); err != nil {
			return fmt.Errorf("node usage %s: %w", kv.Key, err)
		}
		n.Usage, n.UsageRev = &u, kv.ModRevision
	case NodeOutputKey:
		name := NodeOutputName(string(kv.Key))
		if deleted {
			delete(n.Outputs, name)
			return nil
		}
		var o OutputRecord
		if err := json.Unmarshal(kv.Value, &o); err != nil {
			return fmt.Errorf("node output %s: %w", kv.Key, err)
		}
		o.Rev = kv.ModRevision
		if n.Outputs == nil {
			n.Outputs = map[string]OutputRecord{}
		}
		n.Outputs[name] = o
	case NodeHealthKey:
		if deleted {
			n.Health, n.HealthRev = nodehealth.Record{}, 0
			return nil
		}
		var h nodehealth.Record
		if err := json.Unmarshal(kv.Value, &h); err != nil {
			return fmt.Errorf("node health %s: %w", kv.Key, err)
		}
		n.Health, n.HealthRev = h, kv.ModRevision
	}
	return nil
}

// DecodeNodes groups a range read of /apiary/nodes/ by node id. Records and
// usage that do not decode are skipped (the node then has no record or no
// usage).
func DecodeNodes(kvs []*mvccpb.KeyValue) map[string]*NodeView {
	out := map[string]*NodeView{}
	for _, kv := range kvs {
		id, kind, ok := NodeKeyKind(string(kv.Key))
		if !ok {
			continue
		}
		n := out[id]
		if n == nil {
			n = &NodeView{}
			out[id] = n
		}
		_ = n.Apply(kind, kv, false)
	}
	return out
}

// AssignToken is the fencing token of a stored assignment: its key's
// CreateRevision under the failover epoch its value carries (0 when the
// value does not decode: the revision alone, as before epochs existed).
func AssignToken(value []byte, createRev int64) int64 {
	var a apiaryv1.Assignment
	if proto.Unmarshal(value, &a) != nil {
		return createRev
	}
	return FencingToken(a.GetFailoverEpoch(), createRev)
}
