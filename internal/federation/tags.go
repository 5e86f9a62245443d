package federation

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"apiary.dev/apiary/internal/priority"
)

// Serf tags a regional coordinator publishes in the WAN pool. The encoding is
// compact on purpose: serf accepts at most 512 bytes of encoded tags per
// member, all tags together (MEASURED.md), and labels share that budget.
const (
	TagRole         = "role"   // RoleRegion or RoleGlobal
	TagRegion       = "region" // region name
	TagID           = "id"     // coordinator id
	TagJurisdiction = "jur"
	TagLabels       = "labels" // "k=v,k=v", sorted
	TagAPI          = "api"    // gRPC host:port
	TagHealth       = "health" // Health* values
	TagCapacity     = "cap"    // see Capacity.encode
	TagBacklog      = "bl"     // see Backlog.encode
	TagUpdated      = "t"      // Unix ms of the summary
	TagPolicy       = "pol"    // sovereignty policy fingerprint ("" for none)
	TagShards       = "sh"     // shards the coordinator owns (absent: not published)

	RoleRegion = "region"
	RoleGlobal = "global"

	// HealthOK: etcd answers and at least one node is ready.
	HealthOK = "ok"
	// HealthNoNodes: etcd answers but no node is ready (the region still
	// accepts and queues jobs).
	HealthNoNodes = "no-nodes"
	// HealthEtcdDown: the coordinator's last etcd read failed; the region is
	// treated as down.
	HealthEtcdDown = "etcd-unavailable"

	// MaxTagBytes is serf's limit on a member's encoded tags (bytes).
	MaxTagBytes = 512
)

// SummaryRefresh is how often a coordinator re-reads its region's capacity
// and backlog summary and republishes its tags when they changed (and at
// least every 5 s): the published summary is at most this old plus serf's
// gossip delay.
const SummaryRefresh = time.Second

// Res is a resource vector: cpu in millicores, memory in MiB, whole GPUs.
type Res struct {
	CPUMillis int64
	MemoryMiB int64
	GPUs      int64
}

// Capacity is a region's capacity summary over its nodes.
type Capacity struct {
	// Free is capacity minus allocation, summed over ready nodes.
	Free Res
	// Largest is the per-dimension maximum over the region's registered
	// nodes (ready or not): a task larger than this never fits.
	Largest    Res
	NodesReady int
}

// encode: "f=cpu/mem/gpu;l=cpu/mem/gpu;n=N".
func (c Capacity) encode() string {
	return fmt.Sprintf("f=%d/%d/%d;l=%d/%d/%d;n=%d", c.Free.CPUMillis, c.Free.MemoryMiB, c.Free.GPUs,
		c.Largest.CPUMillis, c.Largest.MemoryMiB, c.Largest.GPUs, c.NodesReady)
}

func decodeCapacity(s string) (Capacity, bool) {
	var c Capacity
	n, err := fmt.Sscanf(s, "f=%d/%d/%d;l=%d/%d/%d;n=%d", &c.Free.CPUMillis, &c.Free.MemoryMiB, &c.Free.GPUs,
		&c.Largest.CPUMillis, &c.Largest.MemoryMiB, &c.Largest.GPUs, &c.NodesReady)
	return c, err == nil && n == 7
}

// Backlog is one priority class's pending tasks against its bound (0 =
// unbounded; Pending -1 = not counted).
type Backlog struct {
	Class   string
	Pending int64
	Bound   int64
}

// encodeBacklog: "pending/bound" per class in priority.Classes order, comma separated.
func encodeBacklog(b []Backlog) string {
	by := map[string]Backlog{}
	for _, x := range b {
		by[x.Class] = x
	}
	parts := make([]string, len(priority.Classes))
	for i, c := range priority.Classes {
		x, ok := by[c]
		if !ok {
			x.Pending = -1
		}
		parts[i] = fmt.Sprintf("%d/%d", x.Pending, x.Bound)
	}
	return strings.Join(parts, ",")
}

func decodeBacklog(s string) []Backlog {
	parts := strings.Split(s, ",")
	if len(parts) != len(priority.Classes) {
		return nil
	}
	out := make([]Backlog, len(priority.Classes))
	for i, p := range parts {
		a, b, _ := strings.Cut(p, "/")
		pend, err1 := strconv.ParseInt(a, 10, 64)
		bound, err2 := strconv.ParseInt(b, 10, 64)
		if err1 != nil || err2 != nil {
			return nil
		}
		out[i] = Backlog{Class: priority.Classes[i], Pending: pend, Bound: bound}
	}
	return out
}

// CoordinatorTags is what a coordinator publishes.
type CoordinatorTags struct {
	Region       string
	ID           string
	Jurisdiction string
	Labels       map[string]string
	APIAddr      string
	Health       string
	Capacity     Capacity
	Backlog      []Backlog
	UpdatedMs    int64
	// Policy is the fingerprint of the coordinator's sovereignty policy
	// (sovereignty.Policy.Fingerprint; "" without --policy).
	Policy string
	// ShardsOwned is how many of the region's shards the coordinator owns
	// (0 for one that owns none, an API-only one included); -1 when not
	// published (an older coordinator): Encode omits the tag and
	// DecodeCoordinatorTags returns -1 without it.
	ShardsOwned int
}

// Encode renders the tags and checks serf's 512-byte limit; the error names
// what to shorten.
func (t CoordinatorTags) Encode() (map[string]string, error) {
	for k, v := range t.Labels {
		if k == "" || strings.ContainsAny(k, ",=") || strings.ContainsAny(v, ",=") {
			return nil, fmt.Errorf("label: %q=%q: region label keys and values must be non-empty keys without ',' or '='", k, v)
		}
	}
	m := map[string]string{
		TagRole: RoleRegion, TagRegion: t.Region, TagID: t.ID, TagJurisdiction: t.Jurisdiction,
		TagLabels: encodeLabels(t.Labels), TagAPI: t.APIAddr, TagHealth: t.Health,
		TagCapacity: t.Capacity.encode(), TagBacklog: encodeBacklog(t.Backlog),
		TagUpdated: strconv.FormatInt(t.UpdatedMs, 10),
	}
	if t.Policy != "" {
		m[TagPolicy] = t.Policy
	}
	if t.ShardsOwned >= 0 {
		m[TagShards] = strconv.Itoa(t.ShardsOwned)
	}
	if n := TagBytes(m); n > MaxTagBytes {
		return nil, fmt.Errorf("label: region tags take %d bytes encoded, more than serf's limit of %d; shorten the region labels (%d bytes; the region name, coordinator id, jurisdiction and API address take %d, the capacity, backlog and shard summary %d)",
			n, MaxTagBytes, len(m[TagLabels]), len(t.Region)+len(t.ID)+len(t.Jurisdiction)+len(t.APIAddr),
			len(m[TagCapacity])+len(m[TagBacklog])+len(m[TagUpdated])+len(m[TagShards]))
	}
	return m, nil
}

// DecodeCoordinatorTags parses a coordinator member's tags; ok is false for
// members that are not coordinators. ShardsOwned is -1 when the tag is
// absent or not a count.
func DecodeCoordinatorTags(m map[string]string) (CoordinatorTags, bool) {
	if m[TagRole] != RoleRegion || m[TagRegion] == "" || m[TagAPI] == "" {
		return CoordinatorTags{}, false
	}
	t := CoordinatorTags{Region: m[TagRegion], ID: m[TagID], Jurisdiction: m[TagJurisdiction],
		Labels: decodeLabels(m[TagLabels]), APIAddr: m[TagAPI], Health: m[TagHealth], Backlog: decodeBacklog(m[TagBacklog]),
		Policy: m[TagPolicy]}
	t.Capacity, _ = decodeCapacity(m[TagCapacity])
	t.UpdatedMs, _ = strconv.ParseInt(m[TagUpdated], 10, 64)
	t.ShardsOwned = -1
	if n, err := strconv.Atoi(m[TagShards]); err == nil && n >= 0 {
		t.ShardsOwned = n
	}
	return t, true
}

// TagBytes is serf's encoded size of a tag map in bytes, the size serf
// compares with its limit (MaxTagBytes): a magic byte, then the map in
// msgpack as serf's go-msgpack handle writes it (legacy raw strings: a
// string of up to 31 bytes has a 1-byte header, a longer one 3; a map of
// up to 15 entries a 1-byte header, a larger one 3).
func TagBytes(m map[string]string) int {
	n := 1 + msgpackHeader(len(m), 16)
	for k, v := range m {
		n += msgpackHeader(len(k), 32) + len(k) + msgpackHeader(len(v), 32) + len(v)
	}
	return n
}

// msgpackHeader is the header size of a msgpack container (legacy raw
// string or map) of n elements whose fix form holds fewer than fix.
func msgpackHeader(n, fix int) int {
	switch {
	case n < fix:
		return 1
	case n < 1<<16:
		return 3
	default:
		return 5
	}
}

func encodeLabels(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}

func decodeLabels(s string) map[string]string {
	out := map[string]string{}
	if s == "" {
		return out
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}
