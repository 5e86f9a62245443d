// Package shards owns hash-range ownership of a region's jobs: which virtual
// shard a job belongs to, which coordinator should own each shard, and the
// claims and fencing epochs that make one coordinator at a time the owner.
//
// A region's job keyspace is split into S virtual shards (default 256) by
// hash range: shard = the range of a 64-bit hash of the job id in which the
// hash falls (Of).
//
// What it owns:
//
//   - Assignment (assign.go, pure): Desired maps the live member set to an
//     owner per shard by rendezvous (highest-random-weight) hashing (Thaler &
//     Ravishankar, IEEE/ACM ToN 1998). Every coordinator computes the same
//     assignment from the same set; a join or leave moves only the shards
//     that must move, about S/n. Balance is binomial: see Desired.
//   - Claims (claims.go): shard s's owner key <prefix>/<s>/owner (Layout) is
//     created under the owner's lease only if absent, in one Txn; its
//     CreateRevision is the shard's Epoch, and Fence is the compare every
//     write for the shard carries (the idea of etcd's concurrency.Election,
//     whose leader key revision is a fencing token). Owners is a watch-based
//     view of every shard's owner.
//   - Reconciler (reconciler.go): the loop each coordinator runs: claim the
//     unowned shards desired for it, hand back (HandBack hook, then Release)
//     the ones desired for another, never take an owned shard, rate-limit
//     hand-backs and let a joining member settle first, so a flapping member
//     cannot churn the region. Members act on their own views and etcd's
//     compare decides, as in Omega's shared-state scheduling (Schwarzkopf et
//     al., EuroSys 2013).
//
// The regional coordinator (regional/ownership.go) runs one Reconciler per
// session lease, with the lease of its member key, so that a lapsed or
// revoked lease drops the member and all its shards at one revision.
//
// This package must not touch job, task or node state: it decides who may
// write, the regional coordinator does the writing.
package shards
