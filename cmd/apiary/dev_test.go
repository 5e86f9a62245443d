package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"apiary.dev/apiary/agent"
	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

// TestDevPortsAndAgentShares runs the built `apiary dev` as a user does and
// checks, from /proc, that every port its processes listen on (router,
// coordinators' API, etcd client and peer, serf WAN over TCP and UDP) is
// below Linux's ephemeral range (32768-60999), where an outgoing
// connection may hold it already; and that its agents split this host
// between them (1/N of its CPUs and memory each) instead of each claiming
// all of it.
func TestDevPortsAndAgentShares(t *testing.T) {
	bin := testutil.Binary(t)
	dir := t.TempDir()
	ready := filepath.Join(dir, "run", "ready.json") // in a directory dev creates, as the README's run/dev.ready
	cmd := exec.Command(bin, "dev", "--regions", "r1:eu", "--agents-per-region", "2",
		"--data-dir", filepath.Join(dir, "data"), "--ready-file", ready)
	logf, err := os.Create(filepath.Join(dir, "dev.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	devLog := func() string { b, _ := os.ReadFile(filepath.Join(dir, "dev.log")); return string(b) }
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	testutil.Eventually(t, 90*time.Second, "apiary dev ready", func() error {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("apiary dev exited: %v\n%s", err, devLog())
		default:
		}
		_, err := os.Stat(ready)
		return err
	})
	var doc devReady
	b, err := os.ReadFile(ready)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.Regions) != 1 {
		t.Fatalf("ready file: %v\n%s", err, b)
	}

	listening := listeningPorts(t, append(childPids(t, cmd.Process.Pid), cmd.Process.Pid))
	t.Logf("listening sockets of apiary dev's processes: %v", listening)
	if len(listening) < 6 { // router API + WAN, coordinator API, etcd client and peer, WAN
		t.Fatalf("found only %d listening sockets of apiary dev's processes: %v", len(listening), listening)
	}
	for _, s := range listening {
		if s.port >= 32768 {
			t.Errorf("%s port %d (pid %d) is in the ephemeral range", s.proto, s.port, s.pid)
		}
	}
	for _, a := range append(strings.Split(doc.Regions[0].Addr, ","), doc.GlobalAddr) {
		_, p, _ := strings.Cut(a, ":")
		if port, _ := strconv.Atoi(p); port >= 32768 || port == 0 {
			t.Errorf("ready file address %s: port in the ephemeral range", a)
		}
	}

	host, err := agent.HostCapacity()
	if err != nil {
		t.Fatal(err)
	}
	wantCPU, wantMem := host.CPUMillis/2, host.MemoryMB/2
	if doc.AgentCPUMillis != wantCPU || doc.AgentMemoryMB != wantMem {
		t.Errorf("ready file: agents offer %d m and %d MiB, want half of this host: %d m and %d MiB",
			doc.AgentCPUMillis, doc.AgentMemoryMB, wantCPU, wantMem)
	}
	out, err := exec.Command(bin, "node", "list", "--addr", doc.Regions[0].Addr, "-o", "json").Output()
	if err != nil {
		t.Fatalf("node list: %v\n%s", err, out)
	}
	var nodes apiaryv1.ListNodesResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(out, &nodes); err != nil {
		t.Fatalf("node list: %v\n%s", err, out)
	}
	if len(nodes.GetNodes()) != 2 {
		t.Fatalf("node list: %d nodes, want 2:\n%s", len(nodes.GetNodes()), out)
	}
	for _, n := range nodes.GetNodes() {
		if c := n.GetCapacity(); c.GetCpuMillis() != wantCPU || c.GetMemoryMb() != wantMem {
			t.Errorf("node %s offers %d m and %d MiB, want half of this host: %d m and %d MiB",
				n.GetId(), c.GetCpuMillis(), c.GetMemoryMb(), wantCPU, wantMem)
		}
	}
	if want := fmt.Sprintf("each of the 2 agents offers %d millicores and %d MiB", wantCPU, wantMem); !strings.Contains(devLog(), want) {
		t.Errorf("apiary dev did not print %q:\n%s", want, devLog())
	}
}

// childPids returns the pids whose parent is pid.
func childPids(t *testing.T, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

type listenSocket struct {
	proto string
	port  int
	pid   int
}

// listeningPorts returns the TCP sockets in LISTEN and the unconnected UDP
// sockets that the given processes hold, from /proc/PID/fd and
// /proc/net/{tcp,tcp6,udp,udp6}.
func listeningPorts(t *testing.T, pids []int) []listenSocket {
	t.Helper()
	owner := map[string]int{} // socket inode -> pid
	for _, pid := range pids {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if ino, ok := strings.CutPrefix(l, "socket:["); err == nil && ok {
				owner[strings.TrimSuffix(ino, "]")] = pid
			}
		}
	}
	var out []listenSocket
	for _, tab := range []struct{ file, proto, state string }{
		{"tcp", "tcp", "0A"}, {"tcp6", "tcp", "0A"}, {"udp", "udp", "07"}, {"udp6", "udp", "07"},
	} {
		b, err := os.ReadFile("/proc/net/" + tab.file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != tab.state {
				continue
			}
			pid, ok := owner[f[9]]
			if !ok {
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			port, err := strconv.ParseInt(hexPort, 16, 32)
			if err != nil {
				t.Fatalf("/proc/net/%s: %q: %v", tab.file, line, err)
			}
			out = append(out, listenSocket{proto: tab.proto, port: int(port), pid: pid})
		}
	}
	return out
}
