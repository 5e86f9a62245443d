// Package scheduler is the scheduling loop of the shards a coordinator owns
// (docs/architecture.md, "Data flow of one job", steps 3 to 5). The
// coordinator (package regional) builds it with New from Deps and a
// ShardSet, runs it (Loop.Run) and rebuilds it when it fails; its
// reconciler's hooks keep the ShardSet (Set, HandBack).
//
// # What it owns
//
// The loop, in pieces:
//
//	scheduler.go     the loop (Run, round) and its reclaim and cancel passes
//	place.go         the placement pass: candidates → engine → plan writes
//	ownercache.go    the watch cache of jobs, tasks and nodes (ownerCache)
//	nodesnapshot.go  the engine's node input and GPU layout (nodeSnapshot)
//	placeinput.go    records → placement types
//	candidates.go    which pending tasks a round considers; reason gating
//	homenodes.go     which nodes a round leaves to another owner (home nodes)
//	committer.go     the fenced write path (Committer; commit, reread)
//	retention.go     deletion of finished jobs
//	shardset.go      the shards the loop may write for (ShardSet), ShardStat
//	telemetry.go     the loop's spans, metrics and gauges
//
// The cache holds the whole region (a node's usage is derived from every
// task on it, whatever its shard), and a round of reclaim (node loss) →
// cancel → place → usage sync → retention acts only on the jobs and tasks
// of the owned shards. Every write goes through Deps.Commit, fenced on the
// epoch of each shard written for (the CreateRevision of its owner key,
// package shards); plans also compare each node's alive epoch and usage
// ModRevision and each task's ModRevision, and a conflict is re-read and
// requeued. A fenced write drops the shards it lost.
//
// The Committer interface is declared here, with its one user; the fence
// types and the etcd implementation (store.EtcdCommitter) are package
// regional/store's. So rounds run in unit tests against an in-memory
// committer (owner_test.go, fakecommit_test.go).
//
// # What it must not touch
//
// It must not import package regional (internal/layering checks it): what
// it needs from its coordinator comes in Deps. It must not decide a task
// transition itself (package regional/taskstate), choose nodes (package
// placement, given the snapshot it builds), claim or hand back shards
// (package shards, through the coordinator's reconciler), spell an etcd key
// or record (package regional/store), or write to etcd except through
// Deps.Commit.
package scheduler
