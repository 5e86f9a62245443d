package regional

import (
	"testing"
	"time"
)

// TestHeartbeatTimingScalesWithTheFleet: small fleets keep the lease's
// quarter (at most 500 ms) and the configured lease; past rate × 0.5 s
// nodes the interval is nodes ÷ rate and the lease four intervals, in
// whole seconds.
func TestHeartbeatTimingScalesWithTheFleet(t *testing.T) {
	for _, tc := range []struct {
		lease         time.Duration
		rate          float64
		n             int
		interval, ttl time.Duration
	}{
		{2 * time.Second, 2000, 1, 500 * time.Millisecond, 2 * time.Second},
		{2 * time.Second, 2000, 1000, 500 * time.Millisecond, 2 * time.Second},
		{2 * time.Second, 2000, 1002, 501 * time.Millisecond, 3 * time.Second},
		{2 * time.Second, 2000, 10000, 5 * time.Second, 20 * time.Second},
		{time.Second, 2000, 10, 250 * time.Millisecond, time.Second},
		{30 * time.Second, 2000, 10000, 5 * time.Second, 30 * time.Second},
		{2 * time.Second, 100, 1000, 10 * time.Second, 40 * time.Second},
		{2 * time.Second, 0, 10000, 5 * time.Second, 20 * time.Second}, // 0: the default rate
	} {
		iv, ttl := fleetHeartbeat(tc.lease, tc.rate, tc.n)
		if iv != tc.interval || ttl != tc.ttl {
			t.Errorf("lease %v, rate %v, %d nodes: interval %v, lease %v; want %v, %v", tc.lease, tc.rate, tc.n, iv, ttl, tc.interval, tc.ttl)
		}
	}
}
