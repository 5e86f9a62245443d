package regional

import (
	"math"
	"time"
)

// DefaultMaxHeartbeatsPerSecond is the region-wide heartbeat rate the node
// leases are sized for (--max-heartbeats-per-second).
const DefaultMaxHeartbeatsPerSecond = 2000

// heartbeatTiming is how often an agent that registers now heartbeats,
// and the lease it gets. The interval is a quarter of the node lease, at
// most 500 ms (so that the fast reclaim's evidence, heartbeats that
// stopped, is as quick as serf whatever the lease), and at least as long
// as the fleet needs to stay within --max-heartbeats-per-second: nodes ÷
// rate. A region of 10,000 nodes at the default 2,000/s beats every 5 s.
// This is Nomad's rule (its servers hand out heartbeat TTLs of nodes ÷
// max_heartbeats_per_second), so the heartbeat load of a growing fleet
// stays flat and failure detection slows instead (serf's LAN pool still
// sees a crash in about a second; the fast reclaim then waits
// heartbeatVeto). The lease is --node-lease-ttl, or four intervals when
// the fleet's rate made those longer, in whole seconds (etcd leases are).
// Every node with a record counts (one that left may come back), and the
// new node too.
func (c *Coordinator) heartbeatTiming() (interval, ttl time.Duration) {
	return fleetHeartbeat(c.cfg.NodeLeaseTTL, c.cfg.MaxHeartbeatsPerSecond, c.nodes.Len()+1)
}

// fleetHeartbeat is the heartbeat interval and node lease TTL for a fleet
// of n nodes under the region's lease and rate (heartbeatTiming).
func fleetHeartbeat(lease time.Duration, rate float64, n int) (interval, ttl time.Duration) {
	if rate <= 0 {
		rate = DefaultMaxHeartbeatsPerSecond
	}
	base := min(lease.Round(time.Second)/4, 500*time.Millisecond)
	fleet := time.Duration(float64(n) / rate * float64(time.Second)).Round(time.Millisecond)
	interval = max(base, fleet)
	ttl = max(lease, 4*interval)
	return interval, time.Duration(math.Ceil(ttl.Seconds())) * time.Second
}
