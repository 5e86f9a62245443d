package regional

import (
	"fmt"
	"strconv"
	"strings"
)

// The regional keyspace. This file is the only place that spells etcd keys;
// docs/architecture.md describes the same layout.
//
//	/apiary/meta                              region name, jurisdiction, shard count (fixed at creation)
//	/apiary/members/<coordID>                 coordinator presence (its API and LAN addresses), under its lease
//	/apiary/shards/<s>/owner                  owner of shard s (coordinator id), under its session lease; CreateRevision = the shard's epoch
//	/apiary/jobs/<s>/<jobID>                  job record (spec, submission, cancel flag)
//	/apiary/tasks/<s>/<jobID>/<index>         task record (state, attempt, node, node epoch)
//	/apiary/results/<s>/<jobID>/<index>/<n>   result of attempt n (exit code, output tails)
//	/apiary/assign/<nodeID>/<jobID>/<index>   the node's current assignment; CreateRevision = fencing token
//	/apiary/nodes/<nodeID>                    node record: labels, capacity, epoch, lease
//	/apiary/nodes/<nodeID>/alive              under the node's lease; CreateRevision = node epoch
//	/apiary/nodes/<nodeID>/usage              allocated resources; ModRevision is the placement CAS version
//	/apiary/nodes/<nodeID>/health             attempt outcomes in the attribution window, automatic quarantine (nodehealth.Record)
//	/apiary/quarantine                        ids of the automatically quarantined nodes (the share guard's count)
//	/apiary/dedup/<clientID>/<requestID>      job id and payload hash of a submission
//
// /apiary/acl/ (ACL tokens, policies, join token bindings) is package
// regional/aclstore's: it spells those keys itself (aclstore/keys.go).
const (
	root             = "/apiary/"
	keyMeta          = root + "meta"
	prefMembers      = root + "members/"
	prefShards       = root + "shards" // shards.Layout.Prefix: <prefShards>/<s>/owner
	prefJobs         = root + "jobs/"
	prefTasks        = root + "tasks/"
	prefResults      = root + "results/"
	prefAssign       = root + "assign/"
	prefNodes        = root + "nodes/"
	prefDedup        = root + "dedup/"
	keyQuarantineSet = root + "quarantine"
	suffixAlive      = "/alive"
	suffixUsage      = "/usage"
	suffixHealth     = "/health"
	shardPadding     = 5
)

func shardStr(s int) string { return fmt.Sprintf("%0*d", shardPadding, s) }

func keyJob(shard int, jobID string) string { return prefJobs + shardStr(shard) + "/" + jobID }

func prefJobTasks(shard int, jobID string) string {
	return prefTasks + shardStr(shard) + "/" + jobID + "/"
}

func keyTask(shard int, jobID string, index int32) string {
	return fmt.Sprintf("%s%06d", prefJobTasks(shard, jobID), index)
}

func prefJobResults(shard int, jobID string) string {
	return prefResults + shardStr(shard) + "/" + jobID + "/"
}

func keyResult(shard int, jobID string, index, attempt int32) string {
	return fmt.Sprintf("%s%06d/%04d", prefJobResults(shard, jobID), index, attempt)
}

func prefNodeAssign(nodeID string) string { return prefAssign + nodeID + "/" }

func keyAssign(nodeID, jobID string, index int32) string {
	return fmt.Sprintf("%s%s/%06d", prefNodeAssign(nodeID), jobID, index)
}

func keyNode(nodeID string) string       { return prefNodes + nodeID }
func keyNodeAlive(nodeID string) string  { return prefNodes + nodeID + suffixAlive }
func keyNodeUsage(nodeID string) string  { return prefNodes + nodeID + suffixUsage }
func keyNodeHealth(nodeID string) string { return prefNodes + nodeID + suffixHealth }
func keyMember(coordID string) string    { return prefMembers + coordID }
func keyDedup(client, req string) string { return prefDedup + client + "/" + req }

// nodeKind names which of a node's keys a key under /apiary/nodes/<id> is.
type nodeKind string

// The kinds of node keys (see the layout above).
const (
	nodeRecordKey nodeKind = "record" // /apiary/nodes/<id>
	nodeAliveKey  nodeKind = "alive"  // /apiary/nodes/<id>/alive
	nodeUsageKey  nodeKind = "usage"  // /apiary/nodes/<id>/usage
	nodeHealthKey nodeKind = "health" // /apiary/nodes/<id>/health
)

// nodeKeyKind splits a key under /apiary/nodes/ into node id and kind; ok is
// false for any other key.
func nodeKeyKind(key string) (nodeID string, kind nodeKind, ok bool) {
	rest, found := strings.CutPrefix(key, prefNodes)
	if !found || rest == "" {
		return "", "", false
	}
	id, sub, hasSub := strings.Cut(rest, "/")
	switch {
	case !hasSub:
		return id, nodeRecordKey, true
	case "/"+sub == suffixAlive:
		return id, nodeAliveKey, true
	case "/"+sub == suffixUsage:
		return id, nodeUsageKey, true
	case "/"+sub == suffixHealth:
		return id, nodeHealthKey, true
	}
	return "", "", false
}

// Key predicates: which part of the keyspace a key (from a range read or a
// watch) belongs to.
func isJobKey(key string) bool    { return strings.HasPrefix(key, prefJobs) }
func isTaskKey(key string) bool   { return strings.HasPrefix(key, prefTasks) }
func isAssignKey(key string) bool { return strings.HasPrefix(key, prefAssign) }
func isNodeKey(key string) bool   { return strings.HasPrefix(key, prefNodes) }

// parseTaskKey splits /apiary/tasks/<s>/<jobID>/<index>.
func parseTaskKey(key string) (shard int, jobID string, index int32, ok bool) {
	rest, found := strings.CutPrefix(key, prefTasks)
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

// parseJobKey splits /apiary/jobs/<s>/<jobID>.
func parseJobKey(key string) (shard int, jobID string, ok bool) {
	rest, found := strings.CutPrefix(key, prefJobs)
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
