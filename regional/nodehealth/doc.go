// Package nodehealth is per-node failure attribution and automatic
// quarantine, as pure functions over a node's health record (stored by
// package regional at /apiary/nodes/<id>/health): the sliding window of
// attempt outcomes on the node, the outlier rule that compares the node's
// failure rate with the rest of the region's, and the quarantine's own
// state machine (quarantined → probed with one canary after a backoff →
// released, or quarantined again with a longer backoff).
//
// The ideas and their lessons come from elsewhere: Spark's
// excludeOnFailure (count failures per executor across tasks, exclude for
// a timeout, then let it back), whose false positives taught that one bad
// job must not exclude a node (failures must come from several jobs) and
// that exclusion must time out; and Nomad's plan-rejection tracker (a node
// whose plans keep failing is marked ineligible once a count in a window is
// passed), whose lesson is a window, not a lifetime count. The relative
// test against the rest of the region is what keeps a region-wide cause (a
// bad job, a broken shared service) from quarantining the fleet; a share
// guard (Guard) is the backstop.
//
// It owns the rules and the record's shape. It must not read or write etcd,
// know gRPC or placement, or decide a task's transition (package taskstate
// does, given the Blame this package computes).
package nodehealth
