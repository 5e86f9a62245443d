package agent

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"

	"apiary.dev/apiary/internal/lan"
	"apiary.dev/apiary/internal/testutil"
)

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

// TestLANSaysWhenAlone: an agent's LAN member that joined the pool through
// a real serf member (a coordinator's) and then sees no alive member
// while the coordinators answer its heartbeats logs one ERROR saying so,
// not one per check; and nothing while it is in the pool.
func TestLANSaysWhenAlone(t *testing.T) {
	var logs testutil.LogBuffer
	a, err := New(Config{NodeID: "n1", CoordinatorAddrs: []string{"127.0.0.1:1"}, DataDir: t.TempDir(),
		Capacity: Resources{CPUMillis: 1000, MemoryMB: 1024}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	l := &agentLAN{a: a, joinNew: make(chan struct{}, 1), aloneAfter: 200 * time.Millisecond}
	if err := l.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.serf.Shutdown() })
	conf, err := lan.NewSerfConfig(lan.MemberConfig{Name: lan.MemberName(lan.RoleCoordinator, "c1"), Bind: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	coord, err := serf.Create(conf)
	if err != nil {
		t.Fatal(err)
	}
	join := []string{lan.Addr(coord.LocalMember())}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { l.joinLoop(ctx, join); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, 5*time.Second, func() bool { return l.joined.Load() }, "the member joined")
	a.mu.Lock()
	a.epoch, a.leaseTTL, a.lastContact = 1, time.Hour, time.Now() // the coordinators answer heartbeats
	a.mu.Unlock()

	var w aloneWatch
	for range 3 {
		l.checkAlone(&w, join)
	}
	if !w.since.IsZero() || strings.Contains(logs.String(), "sees no other alive member") {
		t.Fatalf("alone while in the pool:\n%s", logs.String())
	}

	_ = coord.Shutdown() // a crash, not a leave: the pool marks it failed
	waitFor(t, 10*time.Second, func() bool { l.checkAlone(&w, join); return w.said }, "the member alone said so")
	for range 5 {
		l.checkAlone(&w, join)
	}
	if n := strings.Count(logs.String(), "level=ERROR msg=\"the LAN member joined the region's pool but sees no other alive member"); n != 1 {
		t.Fatalf("%d ERRORs, want 1:\n%s", n, logs.String())
	}
}
