package lan

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"apiary.dev/apiary/internal/federation"
)

// Tags of the LAN pool. Every member says its role; the rest depends on it.
const (
	TagRole  = federation.TagRole // RoleAgent or RoleCoordinator
	TagNode  = "node"             // agent: node id
	TagEpoch = "epoch"            // agent: node epoch (decimal; 0 while unregistered)
	TagFree  = "free"             // agent: Free.encode
	TagID    = "id"               // coordinator: coordinator id

	RoleAgent       = "agent"
	RoleCoordinator = "coordinator"

	// MaxTagBytes is serf's limit on a member's encoded tags, all together.
	MaxTagBytes = federation.MaxTagBytes
)

// Free is an agent's free capacity: its offer minus what its running
// attempts hold (cpu in millicores, memory in MiB, whole GPUs), and the
// attempts it may still start (-1: no --max-tasks limit).
type Free struct {
	CPUMillis int64
	MemoryMiB int64
	GPUs      int32
	Tasks     int32
}

// encode: "cpu/mem/gpus/tasks", e.g. "3500/3072/0/-1".
func (f Free) encode() string {
	return fmt.Sprintf("%d/%d/%d/%d", f.CPUMillis, f.MemoryMiB, f.GPUs, f.Tasks)
}

func decodeFree(s string) (Free, bool) {
	p := strings.Split(s, "/")
	if len(p) != 4 {
		return Free{}, false
	}
	var v [4]int64
	for i, x := range p {
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return Free{}, false
		}
		v[i] = n
	}
	return Free{CPUMillis: v[0], MemoryMiB: v[1], GPUs: int32(v[2]), Tasks: int32(v[3])}, true
}

// AgentTags is what an agent publishes.
type AgentTags struct {
	NodeID string
	// Epoch is the node epoch the agent holds (0 while unregistered). A
	// coordinator ends exactly this epoch when the member fails, and only
	// if it is still the node's current one.
	Epoch int64
	Free  Free
}

// Encode renders the tags and checks serf's 512-byte limit (a node id of
// 128 bytes, the longest a coordinator registers, leaves room to spare).
func (t AgentTags) Encode() (map[string]string, error) {
	if t.NodeID == "" {
		return nil, errors.New("node id: must be set")
	}
	if t.Epoch < 0 {
		return nil, fmt.Errorf("epoch: must be >= 0, got %d", t.Epoch)
	}
	m := map[string]string{TagRole: RoleAgent, TagNode: t.NodeID,
		TagEpoch: strconv.FormatInt(t.Epoch, 10), TagFree: t.Free.encode()}
	if n := federation.TagBytes(m); n > MaxTagBytes {
		return nil, fmt.Errorf("node id: agent tags take %d bytes encoded, more than serf's limit of %d; shorten the node id (%d bytes)",
			n, MaxTagBytes, len(t.NodeID))
	}
	return m, nil
}

// DecodeAgentTags parses an agent member's tags; ok is false for members
// that are not agents or whose tags do not parse (the free summary may be
// missing: it is informational).
func DecodeAgentTags(m map[string]string) (AgentTags, bool) {
	if m[TagRole] != RoleAgent || m[TagNode] == "" {
		return AgentTags{}, false
	}
	epoch, err := strconv.ParseInt(m[TagEpoch], 10, 64)
	if err != nil || epoch < 0 {
		return AgentTags{}, false
	}
	free, _ := decodeFree(m[TagFree])
	return AgentTags{NodeID: m[TagNode], Epoch: epoch, Free: free}, true
}

// CoordinatorTags is what a coordinator publishes.
type CoordinatorTags struct {
	ID string
}

// Encode renders the tags.
func (t CoordinatorTags) Encode() (map[string]string, error) {
	if t.ID == "" {
		return nil, errors.New("id: must be set")
	}
	m := map[string]string{TagRole: RoleCoordinator, TagID: t.ID}
	if n := federation.TagBytes(m); n > MaxTagBytes {
		return nil, fmt.Errorf("id: coordinator tags take %d bytes encoded, more than serf's limit of %d", n, MaxTagBytes)
	}
	return m, nil
}

// DecodeCoordinatorTags parses a coordinator member's tags; ok is false for
// other members.
func DecodeCoordinatorTags(m map[string]string) (CoordinatorTags, bool) {
	if m[TagRole] != RoleCoordinator || m[TagID] == "" {
		return CoordinatorTags{}, false
	}
	return CoordinatorTags{ID: m[TagID]}, true
}
