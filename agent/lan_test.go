package agent

import "testing"

// TestDefaultLANAddr: without --lan-addr the agent binds, on port 0, the
// local address of its route to the first coordinator that resolves, so a
// coordinator on loopback gets a loopback member; with none resolvable, all
// addresses.
func TestDefaultLANAddr(t *testing.T) {
	for _, tc := range []struct {
		coords []string
		want   string
	}{
		{[]string{"127.0.0.1:7070"}, "127.0.0.1:0"},
		{[]string{"no-such-host.invalid:7070", "127.0.0.1:7071"}, "127.0.0.1:0"},
		{[]string{"no-such-host.invalid:7070"}, "0.0.0.0:0"},
		{nil, "0.0.0.0:0"},
	} {
		if got := defaultLANAddr(tc.coords); got != tc.want {
			t.Errorf("defaultLANAddr(%v) = %q, want %q", tc.coords, got, tc.want)
		}
	}
}
