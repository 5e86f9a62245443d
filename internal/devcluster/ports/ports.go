// Package ports hands out loopback ports below Linux's ephemeral port range,
// for processes that are told their port before they bind it (the
// coordinators, etcd members, serf members and routers that `apiary dev`,
// the integration tests and the load-test harness start) and for the
// servers that tests start in-process.
//
// Every port comes from [Low, High) = [20000, 32000). The kernel hands out
// ports for outgoing connections and for binds to port 0 from
// net.ipv4.ip_local_port_range (32768-60999 by default): a port picked there
// and released can be taken by an outgoing connection before the process
// that was told to bind it does, which then fails with "address already in
// use". Below 32768 the kernel hands out nothing by itself.
//
// Two pickers must not hand out the same port (go test runs the test
// binaries of several packages at once, and `apiary dev` may run beside
// them): each port handed out is reserved by an exclusive flock(2) on the
// file $TMPDIR/apiary-ports/PORT, held until the process exits (the kernel
// drops the lock then, so a crash leaves nothing to clean up). A port
// locked by another process is skipped, and so is one that something is
// bound to on 127.0.0.1 or on every address, over TCP or UDP (serf uses
// both on one port). Each process starts its scan at an offset derived
// from its pid, so that parallel pickers rarely try the same locks. If the
// lock directory cannot be used, ports are reserved within the process only.
package ports

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// Low and High bound the ports handed out: Low <= port < High, all below
// the default ephemeral range's start, 32768.
const (
	Low  = 20000
	High = 32000
)

var (
	mu       sync.Mutex
	next     = -1 // offset into [Low, High) of the next candidate; -1: not started
	lockDir  string
	lockOK   bool
	dirOnce  sync.Once
	reserved = map[int]*os.File{} // port -> its held lock file (nil: lockless)
)

func initDir() {
	lockDir = filepath.Join(os.TempDir(), "apiary-ports")
	if err := os.MkdirAll(lockDir, 0o777); err != nil {
		return
	}
	// Other users of the host may pick too; best effort.
	_ = os.Chmod(lockDir, 0o777|os.ModeSticky)
	probe := filepath.Join(lockDir, ".probe-"+strconv.Itoa(os.Getpid()))
	f, err := os.OpenFile(probe, os.O_RDONLY|os.O_CREATE, 0o666)
	if err != nil {
		return
	}
	f.Close()
	os.Remove(probe)
	lockOK = true
}

// reserve takes port's lock for the life of the process; false if another
// process (or an earlier call in this one) holds it.
func reserve(port int) bool {
	if _, ok := reserved[port]; ok {
		return false
	}
	if !lockOK {
		reserved[port] = nil
		return true
	}
	f, err := os.OpenFile(filepath.Join(lockDir, strconv.Itoa(port)), os.O_RDONLY|os.O_CREATE, 0o666)
	if err != nil {
		return false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	reserved[port] = f
	return true
}

func release(port int) {
	if f := reserved[port]; f != nil {
		f.Close()
	}
	delete(reserved, port)
}

// free reports whether nothing is bound to port on loopback over TCP or UDP
// (a bind to 127.0.0.1 also fails while something holds the port on every
// address).
func free(port int) bool {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	pc.Close()
	return true
}

// scan calls try on candidate ports, each reserved first, in order from this
// process's cursor, until try accepts one or every port was tried once.
// try returns true to keep the port; on false the reservation is dropped.
func scan(try func(port int) bool) (int, error) {
	dirOnce.Do(initDir)
	mu.Lock()
	defer mu.Unlock()
	span := High - Low
	if next < 0 {
		next = (os.Getpid() * 7919) % span
	}
	for i := 0; i < span; i++ {
		port := Low + next
		next = (next + 1) % span
		if !reserve(port) {
			continue
		}
		if try(port) {
			return port, nil
		}
		release(port)
	}
	return 0, fmt.Errorf("ports: no free loopback port left in [%d, %d)", Low, High)
}

// Pick returns n distinct loopback ports in [Low, High) that were free for
// TCP and UDP a moment ago and stay reserved against every other picker
// until this process exits. The caller (or a process it starts) binds them
// on 127.0.0.1. It fails only if fewer than n free ports are left in the
// range.
func Pick(n int) ([]int, error) {
	if n < 0 {
		return nil, errors.New("ports: n must be >= 0")
	}
	out := make([]int, 0, n)
	for len(out) < n {
		p, err := scan(free)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// Listen returns a TCP listener on 127.0.0.1 at a port in [Low, High),
// reserved against every other picker until this process exits (a port
// number passed around while the listener stays open: there is no window in
// which another process can take it).
func Listen() (net.Listener, error) {
	var l net.Listener
	_, err := scan(func(port int) bool {
		var err error
		l, err = net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		return err == nil
	})
	return l, err
}
