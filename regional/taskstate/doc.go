// Package taskstate is the task state machine of DESIGN.md: the durable shape
// of a task and every transition it may take, as pure functions of (task,
// event, time). It owns the rules on attempts, node epochs, stale reports,
// retry classification, bounded exponential backoff with jitter, node-loss
// reclaim and the KilledWorker limit, and the derivation of a job's state
// from its tasks.
//
//	PENDING → ASSIGNED(attempt n, node, node epoch) → RUNNING → COMPLETE
//	                                           └→ FAILED (terminal)
//	retryable failure → PENDING after backoff (attempt budget permitting)
//	node lost (lease gone) → PENDING, no backoff (attempt budget permitting)
//	preempted (ASSIGNED/RUNNING marked PreemptedBy, its end) → PENDING at
//	once, not charged; the preemptor holds a Reservation meanwhile
//
// It must not do I/O: the regional coordinator reads records from etcd, calls
// these functions, and commits the result in one fenced or compared Txn.
package taskstate
