// Package store is the regional etcd keyspace and what is stored in it:
// the keys, the records, and the fenced-Txn helpers that every write made
// for a shard goes through. It is shared by the coordinator (package
// regional) and its scheduling loop (package regional/scheduler), so that
// neither spells a key or a record of its own.
//
// # What it owns
//
//   - The etcd keyspace of a region (keys.go). It is the only place that
//     spells a key: /apiary/meta, members, shard owners (the prefix that
//     shards.Layout is given), jobs, tasks, results, assignments, nodes
//     (record, alive, usage, health), the quarantine set and dedup keys.
//     docs/architecture.md describes the same layout. /apiary/acl/ is
//     regional/aclstore's.
//   - The stored records (records.go): the JSON of the job, node, usage,
//     dedup, meta and member records, MustJSON (their one encoding), the
//     secret env marker of a stored assignment, and NodeView, the one
//     decoding of a node's keys (record, alive epoch, usage, health).
//   - The job spec cache (specs.go), filled by the scheduling loop's cache
//     and by report commit, and PolicyOf, a stored spec's retry policy.
//   - The fenced-Txn helpers (commit.go): Fence (a shard and its epoch, the
//     CreateRevision of its owner key), FencedError and ErrFenced, and
//     EtcdCommitter, which commits ops only while every fence holds and
//     names the shards whose fence failed. EtcdCtx bounds every etcd call.
//
// The write path's interface, scheduler.Committer, lives with its one user
// in package regional/scheduler (Go's consumer-side interface); only its
// etcd implementation and the fence types it speaks are here, so that the
// loop's unit tests can stand an in-memory committer in its place.
//
// # What it must not touch
//
// It imports nothing of package regional or regional/scheduler
// (internal/layering checks it). It makes no decision: no task transition
// (package regional/taskstate), no placement, no ownership claim (package
// shards); it holds no state but the spec cache and starts no goroutine.
// Its only etcd calls are EtcdCommitter's: a caller decides what to write
// and when.
package store
