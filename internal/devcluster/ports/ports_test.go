package ports

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// ephemeralLow is the start of this host's ephemeral port range (32768 if
// the sysctl cannot be read).
func ephemeralLow(t *testing.T) int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatalf("ip_local_port_range %q: %v", b, err)
	}
	return lo
}

// TestPickBelowEphemeralRange: every port is in [Low, High), below 32768 and
// the host's ephemeral range, distinct, and bindable by its user.
func TestPickBelowEphemeralRange(t *testing.T) {
	eph := ephemeralLow(t)
	ps, err := Pick(40)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if p < Low || p >= High || p >= 32768 || p >= eph {
			t.Errorf("port %d outside [%d, %d) or not below the ephemeral range (%d)", p, Low, High, eph)
		}
		if seen[p] {
			t.Errorf("port %d handed out twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Errorf("port %d: %v", p, err)
			continue
		}
		l.Close()
	}
	l, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lp := l.Addr().(*net.TCPAddr).Port
	if lp < Low || lp >= High || seen[lp] {
		t.Fatalf("Listen: port %d outside [%d, %d) or already handed out", lp, Low, High)
	}
}

// TestPickSkipsBusyPort: a port something else is bound to is never handed
// out, over TCP or UDP.
func TestPickSkipsBusyPort(t *testing.T) {
	ps, err := Pick(2)
	if err != nil {
		t.Fatal(err)
	}
	// Take the two ports the cursor will offer next, bypassing the picker,
	// then rewind the cursor to them.
	mu.Lock()
	start := next
	mu.Unlock()
	tcpPort, udpPort := Low+start, Low+(start+1)%(High-Low)
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", tcpPort))
	if err != nil {
		t.Skipf("port %d busy already: %v", tcpPort, err)
	}
	defer l.Close()
	pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", udpPort))
	if err != nil {
		t.Skipf("port %d busy already: %v", udpPort, err)
	}
	defer pc.Close()
	got, err := Pick(1)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] == tcpPort || got[0] == udpPort || got[0] == ps[0] || got[0] == ps[1] {
		t.Fatalf("Pick gave %d; ports %d (TCP) and %d (UDP) are bound, %v handed out", got[0], tcpPort, udpPort, ps)
	}
}

const helperEnv = "APIARY_PORTS_TEST_START"

// TestPickHelper is the other process of TestPickAcrossProcesses: it starts
// its scan where the parent's started and prints the ports it gets.
func TestPickHelper(t *testing.T) {
	s := os.Getenv(helperEnv)
	if s == "" {
		t.Skip("helper process for TestPickAcrossProcesses")
	}
	start, _ := strconv.Atoi(s)
	mu.Lock()
	next = start
	mu.Unlock()
	ps, err := Pick(20)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("PORTS %v\n", ps)
}

// TestPickAcrossProcesses: a second process scanning the very same ports
// gets none of those this process holds, although they are not bound (the
// probes were closed), as a child told its port has not bound it yet.
func TestPickAcrossProcesses(t *testing.T) {
	mine, err := Pick(20)
	if err != nil {
		t.Fatal(err)
	}
	start := mine[0] - Low
	if !lockOK {
		t.Fatalf("lock directory %s unusable: ports are reserved within a process only", lockDir)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPickHelper$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+strconv.Itoa(start))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var theirs []int
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "PORTS ["); ok {
			for _, f := range strings.Fields(strings.TrimSuffix(rest, "]")) {
				p, _ := strconv.Atoi(f)
				theirs = append(theirs, p)
			}
		}
	}
	if len(theirs) != 20 {
		t.Fatalf("helper printed %d ports:\n%s", len(theirs), out)
	}
	held := map[int]bool{}
	for _, p := range mine {
		held[p] = true
	}
	for _, p := range theirs {
		if held[p] {
			t.Errorf("port %d handed out to both processes", p)
		}
	}
}
