package placement

// Resources is an amount of compute. Units: CPU in millicores, memory in MiB,
// GPUs whole devices, GPUMilli thousandths of one GPU (a GPU-sharing request,
// 1..999; exclusive with GPUs).
type Resources struct {
	CPUMillis int64
	MemoryMiB int64
	GPUs      int
	GPUMilli  int
}

// Node is one schedulable host in a snapshot.
type Node struct {
	ID     string
	Labels map[string]string
	// Capacity is what the node offers; Capacity.GPUs is its GPU count.
	Capacity Resources
	// Allocated is CPU and memory already committed (GPU use is in GPUFreeMilli).
	Allocated Resources
	// GPUModel is the model of every GPU on the node ("" if none).
	GPUModel string
	// GPUFreeMilli is the free share of each GPU (1000 = idle); nil means all idle.
	GPUFreeMilli []int
	// MaxTasks caps concurrent tasks on the node; 0 means unlimited.
	MaxTasks int
	// RunningTasks is the number of tasks currently allocated to the node.
	RunningTasks int
	// Quarantined nodes get no new placements.
	Quarantined bool
	// Ineligible nodes (draining, not ready) get no new placements.
	Ineligible bool
	// Reserved nodes get no new placements in this call: the caller keeps
	// them for another scheduler (Apiary's shard owners leave a node to the
	// owner it prefers while that one has a backlog; regional/scheduler,
	// homenodes.go). Unplaced reasons count them as ReasonReserved.
	Reserved bool
	// Datasets held locally: name -> bytes.
	Datasets map[string]int64
}

// Constraint is a hard rule on a node label. Op is one of "=", "!=", "in",
// "not_in", "exists", "not_exists", "<", ">", "version".
type Constraint struct {
	Label  string
	Op     string
	Values []string
}

// Affinity is a soft preference on a node label, Weight in -100..100.
type Affinity struct {
	Label  string
	Op     string
	Values []string
	Weight int
}

// Spread asks for a group's tasks to spread over the values of Label, evenly
// or toward Targets (value -> percent).
type Spread struct {
	Label   string
	Targets map[string]int
	Weight  int
}

// DistinctProperty caps a group's tasks at MaxPerValue per value of Label.
type DistinctProperty struct {
	Label       string
	MaxPerValue int
}

// Dataset is an input of a task and its size in bytes.
type Dataset struct {
	Name      string
	SizeBytes int64
}

// Policy selects the scoring policy.
type Policy string

const (
	PolicyBinpack       Policy = "binpack"
	PolicySpread        Policy = "spread"
	PolicyFragmentation Policy = "fragmentation"
)

// Task is one task to place.
type Task struct {
	// ID is unique in the batch ("<jobID>/<index>").
	ID string
	// GroupKey identifies the task group ("<jobID>/<group>"); distinct-hosts,
	// distinct-property and spread rules count tasks with the same key.
	GroupKey string
	Priority int
	Request  Resources
	// GPUModels allowed; empty means any.
	GPUModels          []string
	Constraints        []Constraint
	Affinities         []Affinity
	Spreads            []Spread
	DistinctHosts      bool
	DistinctProperties []DistinctProperty
	Datasets           []Dataset
	// Jurisdictions the task may run in; a node's "jurisdiction" label must be
	// one of them. Empty means any.
	Jurisdictions []string
	// ExcludedNodes are hard-excluded (e.g. the node refused this task recently).
	ExcludedNodes map[string]bool
	// FailedOn counts this task's earlier failures per node. A node with a
	// count > 0 is hard-excluded while another node could run the task
	// (see Session.PlaceOne); when none could, the task falls back to such
	// nodes rather than never run, and they are penalised in the score
	// (-(1 - 2^-k) after k failures).
	FailedOn map[string]int
	// Policy overrides the engine default when set.
	Policy Policy
	// AntiAffinityGroups are group keys this task must never share a node
	// with (hard; K8s required pod anti-affinity on the hostname topology).
	// A task whose own group is listed is anti-affine to its siblings, like
	// DistinctHosts. Checked against existing allocations by their GroupKey
	// and, symmetrically, against tasks placed earlier in the same batch.
	AntiAffinityGroups []string
	// AntiAffinity, when its Group is set, keeps the task apart from every
	// other member of that anti-affinity group, whatever their GroupKey
	// (Apiary's anti_affinity across jobs; Kubernetes' required pod
	// anti-affinity with a topologyKey).
	AntiAffinity AntiAffinity
	// QoS is the task's quality-of-service class (preemption only).
	QoS QoS
}

// QoS is a task's quality-of-service class (Kubernetes' Guaranteed,
// Burstable, BestEffort) as preemption uses it: victims are taken
// BestEffort first, then Burstable, then Guaranteed, and only a
// Guaranteed task may preempt a Guaranteed one. The zero value is
// Burstable.
type QoS uint8

const (
	QoSBurstable QoS = iota
	QoSBestEffort
	QoSGuaranteed
)

// evictOrder ranks a victim's class: lower is preempted first.
func (q QoS) evictOrder() int {
	switch q {
	case QoSBestEffort:
		return 0
	case QoSGuaranteed:
		return 2
	}
	return 1
}

// AntiAffinity is a task's membership of a named anti-affinity group and
// its scope: at most one member of Group per node (Scope "" or "node") or
// per value of the node label Scope (nodes without the label share the
// value ""). Members are the existing allocations whose AntiAffinityGroup
// is Group and the batch's tasks placed so far whose AntiAffinity.Group is.
// Members of one group may use different scopes: a task is kept out of a
// node when its own scope there holds any member, or when the node lies in
// the scope of a member of another scope (so every member's rule holds,
// whatever the order they were placed in). A node excluded by it is counted
// under "anti-affinity group <Group> per <node|Scope>" in an unplaced
// reason (the task's own scope).
type AntiAffinity struct {
	Group string
	Scope string
}

// ScopeNode is AntiAffinity.Scope's per-node scope ("" means it too).
const ScopeNode = "node"

// Allocation is a task already placed on a node (used for group rules and
// preemption).
type Allocation struct {
	TaskID   string
	GroupKey string
	NodeID   string
	Priority int
	Request  Resources
	// GPUIndices are the GPUs the allocation uses.
	GPUIndices []int
	// AntiAffinityGroup is the anti-affinity group the allocation's task
	// belongs to ("" for none; Task.AntiAffinity) and AntiAffinityScope its
	// scope ("" or ScopeNode: per node).
	AntiAffinityGroup string
	AntiAffinityScope string
	// QoS is the allocation's task's class (preemption order and rule).
	QoS QoS
}

// Snapshot is the input state: nodes and existing allocations.
type Snapshot struct {
	Nodes    []*Node
	Existing []Allocation
	// Generation, when not 0, identifies the node set: the nodes' IDs and
	// order, labels, capacities and GPU models. A caller that sets it must
	// change it whenever any of those change; usage (Allocated,
	// GPUFreeMilli, RunningTasks), Existing and the Quarantined, Ineligible,
	// Reserved and MaxTasks fields may change freely between snapshots of one
	// generation. The engine then reuses the label indexes and value codes
	// it built for an earlier snapshot of the same generation and the same
	// node IDs (checked on every call) instead of rebuilding them per call.
	// 0 means unknown: nothing is reused.
	Generation uint64
}

// Placement assigns a task to a node.
type Placement struct {
	TaskID string
	NodeID string
	// GPUIndices the task gets (whole GPUs, or the one GPU it shares).
	GPUIndices []int
	Score      float64
}

// Unplaced is a task that fits nowhere, with the reason.
type Unplaced struct {
	TaskID string
	// Reason is a one-line summary, e.g. "memory: 812 nodes, quarantined: 3".
	Reason string
	// Excluded counts nodes excluded per filter reason.
	Excluded map[string]int
	// Fragmented is true when total free capacity suffices but no node has it.
	Fragmented bool
}

// Preemption proposes evicting allocations to make room for a task.
type Preemption struct {
	ForTaskID string
	NodeID    string
	Evict     []string
}

// Plan is the result of one placement pass. Placements are consistent with
// each other: together they never over-commit a node.
type Plan struct {
	Placements  []Placement
	Unplaced    []Unplaced
	Preemptions []Preemption
}

// Placer places a batch of tasks onto a snapshot. Implementations must not
// mutate the snapshot and must be deterministic for a given seed and input.
type Placer interface {
	Place(snap *Snapshot, tasks []Task) Plan
}

// Baseline policies, mainly for `apiary placement simulate` and the
// benchmarks: best-fit (the node with the least remaining resources after
// placement, as in the FGD paper's baseline) and random (uniform over the
// feasible nodes, seeded).
const (
	PolicyBestFit Policy = "bestfit"
	PolicyRandom  Policy = "random"
)
