// Package lan is the vocabulary of a region's serf LAN pool, which every
// coordinator and every agent of the region joins: the tuned member
// configuration (MEASURED.md's timings, reconnect and tombstone windows, the
// gossip keyring: federation.Gossip), member names (one per process), and the tags
// each role publishes, within serf's 512-byte tag budget: an agent its node
// id, node epoch and a free-capacity summary (AgentTags), a coordinator its
// id (CoordinatorTags).
//
// The pool only speeds liveness up; the node lease in etcd stays the
// authority. A coordinator that sees an agent's member fail ends that node
// epoch at once, compared on the epoch the member was tagged with
// (regional/lan.go); a wrong suspicion then costs the agent a
// re-registration, and fencing keeps it from ever doubling a commit.
//
// It holds no live state and acts on nothing: the coordinator's member, its
// fast reclaim and its use of the pool for owner suspicion are
// regional/lan.go and regional/suspicion.go; the agent's member is
// agent/lan.go. It must not import regional/, agent/ or global/
// (docs/architecture.md, "Layering"). It reuses internal/federation's serf
// helpers (member config, log adapter, JoinLoop, tag size) rather than
// copying them: the WAN and LAN pools differ in timings and windows only.
package lan
