// Package placement decides which node runs each task: feasibility, scoring
// and bin-packing for Apiary's regional coordinator (DESIGN.md, "Placement
// with reject-and-requeue").
//
// It is a pure library: a Snapshot of nodes and existing allocations and a
// batch of Tasks in, a Plan out. It does no I/O, starts no goroutines, and
// imports only the standard library and nothing else of Apiary's (not even
// api/). The only state it keeps between calls is a cache of what it derives
// from the node set (label value codes and indexes, the ID map), used only
// when the caller sets Snapshot.Generation and the node IDs match
// (table.go); a plan never depends on whether the cache was used.
//
// What it owns:
//   - the model of nodes, requests and rules (types.go);
//   - the pipeline filter → score → normalise → select, after the stages of
//     the Kubernetes scheduling framework (Filter, Score, NormalizeScore) and
//     Nomad's iterator chain (feasibility checkers, rank iterators, limit
//     iterator, score normalisation), with each stage a small type;
//   - explanations for tasks that fit nowhere, counted per filter, and the
//     fragmentation flag;
//   - preemption proposals, as a separate part of the plan;
//   - the fragmentation-aware GPU score (FGD, USENIX ATC 2023, fgd.go) and
//     its packing charge for GPU shares (dual prices of the workload's
//     fractional bin-packing LP, shareprice.go);
//   - the what-if simulation of the Alibaba GPU trace (sub-package sim).
//
// What it must not touch: etcd, serf, gRPC, clocks, logs, the task state
// machine. Committing a plan (the etcd Txn with per-node ModRevision
// compares), requeueing conflicts, excluding nodes that refused a task and
// reporting Unplaced.Reason on the task belong to regional/. The engine never
// mutates the Snapshot; the plan it returns is consistent with itself (no
// node over-committed across the batch), but it is computed on a snapshot
// that is stale by construction, which the optimistic commit resolves.
//
// Units: CPU in millicores, memory in MiB, GPUs as whole devices, GPU shares
// in thousandths of one device (GPU milli), dataset sizes in bytes.
package placement
