// Package regional is the regional coordinator, the process behind
// `apiary region`. A region's etcd cluster is 1, 3 or 5 members, each
// embedded in a coordinator; more coordinators may join as etcd clients only
// (EtcdConfig.Endpoints, etcdclient.go). etcd is the only source of truth: a
// coordinator keeps only caches that it can rebuild from a range read and a
// watch.
//
// # What it owns
//
//   - The embedded etcd member and its settings (etcd.go). The region meta is
//     written once at creation and checked on every start; the region name and
//     shard count are fixed then (coordinator.go). The member's state size:
//     quota and compaction (etcd.go), defragmentation of its own member
//     (defrag.go), snapshots and their offline restore (snapshot.go).
//   - The gRPC services, served by every coordinator, whatever shards it
//     owns:
//     JobService (jobserver.go, submit.go), AgentService (agentserver.go,
//     reports.go) and AdminService (adminserver.go).
//   - Submission: validation (through internal/jobspec), idempotency by
//     (client_id, request_id) with a payload hash, and group commit of
//     submissions in one etcd Txn (batch.go).
//   - Node registration and liveness. Registration creates a node epoch: the
//     CreateRevision of /apiary/nodes/<id>/alive, held under a lease that the
//     agent renews by heartbeat.
//   - Sharded ownership wiring (ownership.go): each coordinator's session
//     lease holds its member key and the owner keys of the shards it
//     claimed; a shards.Reconciler per session converges the claims on the
//     rendezvous assignment of the live members, and its hooks feed the
//     scheduling loop's shard set. The member feed, the sessions, the
//     failover grace and the per-shard counts for ListShards are here too.
//     The scheduling loop itself (watch cache, reclaim → cancel → place →
//     usage sync, retention) is package regional/scheduler: ownership.go
//     builds it (ownerDeps) with a store.EtcdCommitter as its write path,
//     and rebuilds it when it fails.
//   - Reports. They are group-committed: one read Txn, then
//     taskstate.ApplyReport, then one write Txn. The write Txn compares each
//     task's ModRevision and each reporting node's epoch. Any coordinator may
//     commit a report.
//   - Takeover on suspicion (suspicion.go). A coordinator revokes the
//     session lease of a peer whose API port refuses connections for
//     SuspectAfter or whose LAN member failed; the survivors claim its
//     shards.
//   - Its lifecycle (coordinator.go, Coordinator.Parts): every long-running
//     part (etcd, metrics, group commit, API, the member, capacity,
//     suspicion and owner loops, the WAN member) is a dskit service in one
//     ordered list that internal/lifecycle starts in order and stops in
//     reverse; a part that fails stops the process. No part runs on a
//     start-up context.
//
// What moved out: the etcd keyspace, the stored records, the job spec cache
// and the fenced-Txn helpers are package regional/store (keys.go there is
// the only place that spells a key); the scheduling loop of the owned shards
// and its shard set are package regional/scheduler.
//
// # What it must not touch
//
// It must not decide a task transition itself: every change of a task's
// state goes through package regional/taskstate, and the result is committed
// in one compared or fenced Txn. It must not choose nodes: placement is
// package placement, given a snapshot, and the scheduling loop only commits
// its plan. It must not run user processes (package agent does) or keep
// state that exists only in memory. It must not make a write that needs a
// shard's ownership (plans, reclaims, cancels, usage sync, retention): those
// are the scheduling loop's, fenced through its scheduler.Committer. It must
// not spell an etcd key: every key comes from package regional/store.
package regional
