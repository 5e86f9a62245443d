// Package shards owns hash-range ownership of a region's jobs: which virtual
// shard a job belongs to, and which coordinator owns which shards, with the
// fencing epoch every owner write is compared against.
//
// A region's job keyspace is split into S virtual shards (default 256) by
// hash range: shard = the range of a 64-bit hash of the job id in which the
// hash falls (see Of). Ownership is an etcd key per owner created under the
// owner's lease; the key's CreateRevision is the epoch (the same idea as
// etcd's concurrency.Election, whose leader key revision is a fencing token).
//
// This package must not touch job, task or node state: it decides who may
// write, the regional coordinator does the writing.
package shards
