package devcluster

import "testing"

// TestPortsBelowEphemeralRange: every port the cluster's processes are told
// to bind (API, etcd client and peer, serf WAN, router) is below Linux's
// ephemeral range, 32768-60999, where an outgoing connection may hold it
// already.
func TestPortsBelowEphemeralRange(t *testing.T) {
	ps, err := freePorts(12)
	if err != nil {
		t.Fatal(err)
	}
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, port := range append(ps, p) {
		if port >= 32768 {
			t.Errorf("port %d is in the ephemeral range", port)
		}
		if seen[port] {
			t.Errorf("port %d handed out twice", port)
		}
		seen[port] = true
	}
}
