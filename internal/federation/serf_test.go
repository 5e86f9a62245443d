package federation

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"

	"apiary.dev/apiary/internal/testutil"
)

func member(t *testing.T, name, bind string) *serf.Serf {
	t.Helper()
	conf, err := NewSerfConfig(MemberConfig{Name: name, Bind: bind, Tags: map[string]string{TagRole: RoleGlobal}})
	if err != nil {
		t.Fatal(err)
	}
	conf.LogOutput, conf.MemberlistConfig.LogOutput = io.Discard, io.Discard
	s, err := serf.Create(conf)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func aliveNamed(s *serf.Serf, name string) bool {
	for _, m := range s.Members() {
		if m.Name == name && m.Status == serf.StatusAlive {
			return true
		}
	}
	return false
}

// TestJoinLoopRejoinsAMemberThatLeft: a coordinator whose --wan-join names a
// router that starts later, leaves gracefully and starts again on the same
// address (without joining anyone itself) sees the router again: serf does
// not reconnect to a member that left, JoinLoop does.
func TestJoinLoopRejoinsAMemberThatLeft(t *testing.T) {
	routerAddr := testutil.FreeAddr(t)
	coord := member(t, "coord", testutil.FreeAddr(t))
	defer coord.Shutdown()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { JoinLoop(ctx, coord, []string{routerAddr}, nil); close(done) }()
	defer func() { cancel(); <-done }()

	for round := 1; round <= 2; round++ {
		name := fmt.Sprintf("router-%d", round)
		r := member(t, name, routerAddr)
		testutil.Eventually(t, 3*RejoinEvery, name+" seen by the coordinator", func() error {
			if !aliveNamed(coord, name) {
				return fmt.Errorf("coordinator's members: %v", coord.Members())
			}
			return nil
		})
		if err := r.Leave(); err != nil {
			t.Fatal(err)
		}
		if err := r.Shutdown(); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, name+" seen leaving", func() error {
			if aliveNamed(coord, name) {
				return fmt.Errorf("still alive")
			}
			return nil
		})
	}
}
