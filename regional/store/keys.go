package store

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// The regional keyspace. This file is the only place that spells etcd keys
// (every package of the coordinator builds them with these functions);
// docs/architecture.md describes the same layout.
//
//	/apiary/meta                              region name, jurisdiction, shard count (fixed at creation)
//	/apiary/members/<coordID>                 coordinator presence (its API and LAN addresses), under its lease
//	/apiary/shards/<s>/owner                  owner of shard s (coordinator id), under its session lease; CreateRevision = the shard's epoch
//	/apiary/jobs/<s>/<jobID>                  job record (spec, submission, cancel flag)
//	/apiary/tasks/<s>/<jobID>/<index>         task record (state, attempt, node, node epoch)
//	/apiary/results/<s>/<jobID>/<index>/<n>   result of attempt n (exit code, output tails)
//	/apiary/assign/<nodeID>/<jobID>/<index>   the node's current assignment; fencing token = failover epoch << 48 + CreateRevision
//	/apiary/nodes/<nodeID>                    node record: labels, capacity, epoch, lease
//	/apiary/nodes/<nodeID>/alive              under the node's lease; CreateRevision = node epoch
//	/apiary/nodes/<nodeID>/usage              allocated resources; ModRevision is the placement CAS version
//	/apiary/nodes/<nodeID>/health             attempt outcomes in the attribution window, automatic quarantine (nodehealth.Record)
//	/apiary/nodes/<nodeID>/outputs/<name>     a task's output now held by the node: epoch and bytes (OutputRecord)
//	/apiary/quarantine                        ids of the automatically quarantined nodes (the share guard's count)
//	/apiary/placement/antiaffinity/<group>/<label>/<value>
//	                                          a label scope of an anti-affinity group; ModRevision is the CAS version
//	                                          of placing a member there (value: the last member placed, a task key)
//	/apiary/dedup/<clientID>/<requestID>      job id and payload hash of a submission
//	/apiary/upkeep/defrag-lock                the member defragmenting now (its name), under a lease (regional/defrag.go)
//	/apiary/failover/standby/<jobID>          another region's failover job held here on standby (StandbyRecord; regional/failover)
//	/apiary/failover/done/<jobID>/<index>     a standby job's task that completed in its home region (TaskDoneRecord)
//	/apiary/failover/moved/<jobID>            a job this region activated as a standby (MovedRecord); CreateRevision decides it once
//	/apiary/failover/claimed/<jobID>          a standby job this region gave up to a later standby (ClaimRecord)
//	/apiary/failover/observe/<home>/<coordID> a coordinator's observation that region home is down, under its session lease
//	/apiary/failover/home/<jobID>             this region's failover job with standbys (HomeIndexRecord): the progress loop's index
//	/apiary/failover/pending/<jobID>          a failover submission whose standby records are written and whose job is not
//	                                          committed yet (PendingRecord); deleted by the job's commit, or marked abandoned
//	                                          and kept until every standby dropped its record
//	/apiary/failover/ended/<jobID>            a standby region's tombstone of a job its home said ended (7-day lease)
//
// /apiary/acl/ (ACL tokens, policies, join token bindings) is package
// regional/aclstore's: it spells those keys itself (aclstore/keys.go).

// Root is the prefix of every key of the region; the prefixes below are
// those of the layout's parts.
const (
	Root        = "/apiary/"
	KeyMeta     = Root + "meta"
	PrefMembers = Root + "members/"
	PrefShards  = Root + "shards" // shards.Layout.Prefix: <PrefShards>/<s>/owner
	PrefJobs    = Root + "jobs/"
	PrefTasks   = Root + "tasks/"
	PrefResults = Root + "results/"
	PrefAssign  = Root + "assign/"
	PrefNodes   = Root + "nodes/"
	PrefDedup   = Root + "dedup/"
	// The failover keys sort before PrefJobs: outside the scheduling
	// loop's watch range.
	PrefFailover        = Root + "failover/"
	PrefStandby         = PrefFailover + "standby/"
	PrefStandbyDone     = PrefFailover + "done/"
	PrefMoved           = PrefFailover + "moved/"
	PrefClaimed         = PrefFailover + "claimed/"
	PrefEnded           = PrefFailover + "ended/"
	PrefFailoverObserve = PrefFailover + "observe/"
	PrefFailoverHome    = PrefFailover + "home/"
	PrefFailoverPending = PrefFailover + "pending/"
	KeyQuarantineSet    = Root + "quarantine"
	// KeyDefragLock is held, under a lease, by the one member that
	// defragments its backend at a time. "upkeep" sorts after "tasks/",
	// outside the scheduling loop's watch range (PrefJobs to PrefTasks).
	KeyDefragLock = Root + "upkeep/defrag-lock"
	// PrefAntiAffinity sorts between PrefJobs and PrefTasks, so the owner
	// loop's one watch over that range delivers a scope key and the task
	// written with it at one revision (as it does for node usage keys).
	PrefAntiAffinity = Root + "placement/antiaffinity/"
	suffixAlive      = "/alive"
	suffixUsage      = "/usage"
	suffixHealth     = "/health"
	suffixOutputs    = "/outputs/"
	shardPadding     = 5
)

func shardStr(s int) string { return fmt.Sprintf("%0*d", shardPadding, s) }

// KeyJob is the job record's key.
func KeyJob(shard int, jobID string) string { return PrefShardJobs(shard) + jobID }

// PrefShardJobs is the prefix of a shard's job records (KeyJob's keys of
// that shard, in job id order).
func PrefShardJobs(shard int) string { return PrefJobs + shardStr(shard) + "/" }

// PrefJobTasks is the prefix of a job's task records.
func PrefJobTasks(shard int, jobID string) string {
	return PrefTasks + shardStr(shard) + "/" + jobID + "/"
}

// KeyTask is the record of task index of a job.
func KeyTask(shard int, jobID string, index int32) string {
	return fmt.Sprintf("%s%06d", PrefJobTasks(shard, jobID), index)
}

// PrefJobResults is the prefix of a job's attempt results.
func PrefJobResults(shard int, jobID string) string {
	return PrefResults + shardStr(shard) + "/" + jobID + "/"
}

// KeyResult is the result of one attempt of a task.
func KeyResult(shard int, jobID string, index, attempt int32) string {
	return fmt.Sprintf("%s%06d/%04d", PrefJobResults(shard, jobID), index, attempt)
}

// PrefNodeAssign is the prefix of a node's assignments.
func PrefNodeAssign(nodeID string) string { return PrefAssign + nodeID + "/" }

// KeyAssign is a task's current assignment on a node.
func KeyAssign(nodeID, jobID string, index int32) string {
	return fmt.Sprintf("%s%s/%06d", PrefNodeAssign(nodeID), jobID, index)
}

// The keys of a node, a coordinator and a submission (see the layout above).
func KeyNode(nodeID string) string       { return PrefNodes + nodeID }
func KeyNodeAlive(nodeID string) string  { return PrefNodes + nodeID + suffixAlive }
func KeyNodeUsage(nodeID string) string  { return PrefNodes + nodeID + suffixUsage }
func KeyNodeHealth(nodeID string) string { return PrefNodes + nodeID + suffixHealth }

// KeyNodeOutput records that the node holds dataset name, an output of a
// task that completed there (OutputRecord); PrefNodeOutputs is the prefix
// of the node's output keys (a new registration deletes them: its dataset
// scan lists what is still there).
func KeyNodeOutput(nodeID, name string) string { return PrefNodes + nodeID + suffixOutputs + name }
func PrefNodeOutputs(nodeID string) string     { return PrefNodes + nodeID + suffixOutputs }
func KeyMember(coordID string) string          { return PrefMembers + coordID }
func KeyDedup(client, req string) string       { return PrefDedup + client + "/" + req }

// The failover keys of a job (see the layout above).
func KeyStandby(jobID string) string       { return PrefStandby + jobID }
func PrefStandbyTasks(jobID string) string { return PrefStandbyDone + jobID + "/" }
func KeyMoved(jobID string) string         { return PrefMoved + jobID }
func KeyClaimed(jobID string) string       { return PrefClaimed + jobID }

// KeyEnded is a standby region's tombstone of a job its home said ended
// (or never committed): a claim for it is refused and a late standby record
// of it is not stored, so a finished job is never activated by a standby
// that missed the end. It lives EndedTTL.
func KeyEnded(jobID string) string           { return PrefEnded + jobID }
func PrefObserve(home string) string         { return PrefFailoverObserve + home + "/" }
func KeyObserve(home, coordID string) string { return PrefObserve(home) + coordID }
func KeyFailoverHome(jobID string) string    { return PrefFailoverHome + jobID }

// KeyFailoverPending is a failover submission of this region between its
// standby writes and its commit (PendingRecord).
func KeyFailoverPending(jobID string) string { return PrefFailoverPending + jobID }

// KeyStandbyDone records that task index of standby job jobID completed in
// its home region.
func KeyStandbyDone(jobID string, index int32) string {
	return fmt.Sprintf("%s%06d", PrefStandbyTasks(jobID), index)
}

// KeyAntiAffinity is the key of the scope of anti-affinity group whose node
// label label has value value (the label and value path-escaped; group is
// a validated name: jobspec's anti_affinity.group rule). Plans that place a
// member of the group in a label scope compare its ModRevision and rewrite
// it, so two owners cannot both place a member in one scope; the node scope
// needs no key (the node's usage key serialises plans on one node).
func KeyAntiAffinity(group, label, value string) string {
	return PrefAntiAffinity + group + "/" + url.PathEscape(label) + "/" + url.PathEscape(value)
}

// IsAntiAffinityKey reports whether key is a KeyAntiAffinity key.
func IsAntiAffinityKey(key string) bool { return strings.HasPrefix(key, PrefAntiAffinity) }

// AntiAffinityKeyGroup is the group of a KeyAntiAffinity key (false if key
// is not one).
func AntiAffinityKeyGroup(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, PrefAntiAffinity)
	if !ok {
		return "", false
	}
	group, _, ok := strings.Cut(rest, "/")
	return group, ok && group != ""
}

// NodeKind names which of a node's keys a key under /apiary/nodes/<id> is.
type NodeKind string

// The kinds of node keys (see the layout above).
const (
	NodeRecordKey NodeKind = "record" // /apiary/nodes/<id>
	NodeAliveKey  NodeKind = "alive"  // /apiary/nodes/<id>/alive
	NodeUsageKey  NodeKind = "usage"  // /apiary/nodes/<id>/usage
	NodeHealthKey NodeKind = "health" // /apiary/nodes/<id>/health
	NodeOutputKey NodeKind = "output" // /apiary/nodes/<id>/outputs/<name>
)

// NodeKeyKind splits a key under /apiary/nodes/ into node id and kind; ok is
// false for any other key.
func NodeKeyKind(key string) (nodeID string, kind NodeKind, ok bool) {
	rest, found := strings.CutPrefix(key, PrefNodes)
	if !found || rest == "" {
		return "", "", false
	}
	id, sub, hasSub := strings.Cut(rest, "/")
	switch {
	case !hasSub:
		return id, NodeRecordKey, true
	case "/"+sub == suffixAlive:
		return id, NodeAliveKey, true
	case "/"+sub == suffixUsage:
		return id, NodeUsageKey, true
	case "/"+sub == suffixHealth:
		return id, NodeHealthKey, true
	case strings.HasPrefix("/"+sub, suffixOutputs) && len("/"+sub) > len(suffixOutputs):
		return id, NodeOutputKey, true
	}
	return "", "", false
}

// NodeOutputName is the dataset name of a NodeOutputKey key.
func NodeOutputName(key string) string {
	_, name, _ := strings.Cut(key, suffixOutputs)
	return name
}

// Key predicates: which part of the keyspace a key (from a range read or a
// watch) belongs to.
func IsJobKey(key string) bool    { return strings.HasPrefix(key, PrefJobs) }
func IsTaskKey(key string) bool   { return strings.HasPrefix(key, PrefTasks) }
func IsAssignKey(key string) bool { return strings.HasPrefix(key, PrefAssign) }
func IsNodeKey(key string) bool   { return strings.HasPrefix(key, PrefNodes) }

// ParseTaskKey splits /apiary/tasks/<s>/<jobID>/<index>.
func ParseTaskKey(key string) (shard int, jobID string, index int32, ok bool) {
	rest, found := strings.CutPrefix(key, PrefTasks)
	if !found {
		return 0, "", 0, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return 0, "", 0, false
	}
	s, err1 := strconv.Atoi(parts[0])
	i, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil {
		return 0, "", 0, false
	}
	return s, parts[1], int32(i), true
}

// ParseJobKey splits /apiary/jobs/<s>/<jobID>.
func ParseJobKey(key string) (shard int, jobID string, ok bool) {
	rest, found := strings.CutPrefix(key, PrefJobs)
	if !found {
		return 0, "", false
	}
	a, b, found := strings.Cut(rest, "/")
	if !found {
		return 0, "", false
	}
	s, err := strconv.Atoi(a)
	if err != nil {
		return 0, "", false
	}
	return s, b, true
}
