package regional

import (
	"net"
	"testing"
	"time"
)

// Only a refused connection counts for the TCP detector: a port nothing
// listens on is refused at once; a dial that runs out of time (a starved
// prober, a host that drops packets) is not, nor is a dial that connects.
func TestRefusedDialCountsOnlyRefusals(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if _, err := net.DialTimeout("tcp", addr, time.Nanosecond); err == nil || refusedDial(err) {
		t.Fatalf("a dial that timed out: %v, counted as refused: %v", err, refusedDial(err))
	}
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	ln.Close()
	_, err = net.DialTimeout("tcp", addr, time.Second)
	if err == nil || !refusedDial(err) {
		t.Fatalf("a dial to a closed port: %v, counted as refused: %v", err, err != nil && refusedDial(err))
	}
}
