package lan

import (
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"

	"apiary.dev/apiary/internal/federation"
)

// worstAgent is the largest agent tags a coordinator lets register: a node
// id of 128 bytes (regional's nodeIDRE), the largest epoch, and free
// capacity at the registration limits (cpu 2^30 m, memory 2^40 MiB, 1024
// GPUs) with a negative-free and an int32 task count.
func worstAgent() AgentTags {
	return AgentTags{NodeID: strings.Repeat("n", 128), Epoch: math.MaxInt64,
		Free: Free{CPUMillis: -(1 << 30), MemoryMiB: -(1 << 40), GPUs: -1024, Tasks: math.MinInt32}}
}

func create(t *testing.T, name string, tags map[string]string, events chan serf.Event) *serf.Serf {
	t.Helper()
	conf, err := NewSerfConfig(MemberConfig{Name: name, Bind: "127.0.0.1:0", Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	conf.LogOutput, conf.MemberlistConfig.LogOutput = io.Discard, io.Discard
	conf.EventCh = events
	s, err := serf.Create(conf)
	if err != nil {
		t.Fatalf("serf.Create %s: %v", name, err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	return s
}

// TestTagBudgetHoldsInRealSerf: the largest agent and coordinator tags are
// under serf's 512-byte limit by Encode's count and are accepted by a real
// serf member, at creation and by SetTags on a live member (what an agent
// does when its epoch or free capacity changes).
func TestTagBudgetHoldsInRealSerf(t *testing.T) {
	at, err := worstAgent().Encode()
	if err != nil {
		t.Fatal(err)
	}
	ct, err := CoordinatorTags{ID: strings.Repeat("c", 63)}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []map[string]string{at, ct} {
		if n := federation.TagBytes(m); n >= MaxTagBytes {
			t.Fatalf("worst tags take %d bytes, want < %d: %v", n, MaxTagBytes, m)
		}
	}
	t.Logf("worst agent tags: %d bytes; worst coordinator tags: %d bytes", federation.TagBytes(at), federation.TagBytes(ct))
	s := create(t, MemberName(RoleAgent, strings.Repeat("n", 128)), at, nil)
	if err := s.SetTags(at); err != nil {
		t.Fatalf("SetTags of the worst agent tags: %v", err)
	}
	create(t, MemberName(RoleCoordinator, strings.Repeat("c", 63)), ct, nil)

	// And the check bites: a node id far beyond what a coordinator accepts.
	if _, err := (AgentTags{NodeID: strings.Repeat("n", 600), Epoch: 1}).Encode(); err == nil || !strings.HasPrefix(err.Error(), "node id:") {
		t.Fatalf("oversized node id: %v", err)
	}
}

func TestTagsRoundTrip(t *testing.T) {
	for _, in := range []AgentTags{worstAgent(), {NodeID: "n1", Epoch: 42, Free: Free{CPUMillis: 3500, MemoryMiB: 3072, GPUs: 1, Tasks: -1}}} {
		m, err := in.Encode()
		if err != nil {
			t.Fatal(err)
		}
		out, ok := DecodeAgentTags(m)
		if !ok || out != in {
			t.Fatalf("round trip: in %+v out %+v (%v)", in, out, ok)
		}
		if _, ok := DecodeCoordinatorTags(m); ok {
			t.Fatal("agent tags decoded as a coordinator's")
		}
	}
	m, _ := CoordinatorTags{ID: "c1"}.Encode()
	if c, ok := DecodeCoordinatorTags(m); !ok || c.ID != "c1" {
		t.Fatalf("coordinator round trip: %+v %v", c, ok)
	}
	if _, ok := DecodeAgentTags(m); ok {
		t.Fatal("coordinator tags decoded as an agent's")
	}
	if _, ok := DecodeAgentTags(map[string]string{TagRole: RoleAgent, TagNode: "n", TagEpoch: "x"}); ok {
		t.Fatal("bad epoch decoded")
	}
	if _, err := (AgentTags{}).Encode(); err == nil || !strings.HasPrefix(err.Error(), "node id:") {
		t.Fatalf("empty node id: %v", err)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		mc   MemberConfig
		want string
	}{
		{MemberConfig{Name: "x", Bind: "nope"}, "lan-addr:"},
		{MemberConfig{Name: "x", Bind: "127.0.0.1:70000"}, "lan-addr:"},
		{MemberConfig{Name: "x", Bind: "127.0.0.1:0", Advertise: "a"}, "lan-advertise:"},
		{MemberConfig{Name: "x", Bind: "127.0.0.1:0", Gossip: federation.Gossip{Key: []byte("short")}}, "gossip-key:"},
		{MemberConfig{Name: "x", Bind: "127.0.0.1:0", Gossip: federation.Gossip{KeyringFile: notAKeyring(t)}}, "gossip-keyring-file:"},
	} {
		if _, err := NewSerfConfig(tc.mc); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error starting %q", tc.mc, err, tc.want)
		}
	}
	// Fresh config per call: serf.Create mutates the memberlist config.
	a, _ := NewSerfConfig(MemberConfig{Name: "a", Bind: "127.0.0.1:0"})
	b, _ := NewSerfConfig(MemberConfig{Name: "b", Bind: "127.0.0.1:0"})
	if a.MemberlistConfig == b.MemberlistConfig || a.LogOutput == nil || a.MemberlistConfig.LogOutput == nil {
		t.Fatal("configs share a memberlist config or lack a log output")
	}
}

// TestCrashIsFailedLeaveIsNot: in a real pool on port-0 binds, a member
// that shuts down without leaving (a crash) reaches the others as
// EventMemberFailed carrying its last tags (the epoch a coordinator
// compares) within the tuned detection time, and one that leaves reaches
// them as EventMemberLeave, never as a failure.
func TestCrashIsFailedLeaveIsNot(t *testing.T) {
	events := make(chan serf.Event, 64)
	ct, _ := CoordinatorTags{ID: "c1"}.Encode()
	coord := create(t, MemberName(RoleCoordinator, "c1"), ct, events)
	var agents []*serf.Serf
	for i := 1; i <= 3; i++ {
		tags, _ := AgentTags{NodeID: fmt.Sprintf("n%d", i), Epoch: 1}.Encode()
		a := create(t, MemberName(RoleAgent, fmt.Sprintf("n%d", i)), tags, nil)
		if _, err := a.Join([]string{Addr(coord.LocalMember())}, true); err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
	}
	// The epoch the coordinator will compare is the latest one set.
	tags, _ := AgentTags{NodeID: "n1", Epoch: 7, Free: Free{CPUMillis: 100, Tasks: 2}}.Encode()
	if err := agents[0].SetTags(tags); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for seen := false; !seen; {
		select {
		case <-deadline:
			t.Fatal("n1's new tags never reached the coordinator")
		case <-events:
		case <-time.After(20 * time.Millisecond):
		}
		for _, m := range coord.Members() {
			if at, ok := DecodeAgentTags(m.Tags); ok && at.NodeID == "n1" && at.Epoch == 7 {
				seen = true
			}
		}
	}
	if err := agents[1].Leave(); err != nil {
		t.Fatal(err)
	}
	_ = agents[1].Shutdown()
	t0 := time.Now()
	_ = agents[0].Shutdown() // no Leave: a crash
	var failed, left []AgentTags
	timeout := time.After(10 * time.Second)
	for len(failed) == 0 {
		select {
		case <-timeout:
			t.Fatalf("no member-failed event within 10 s; left %v", left)
		case e := <-events:
			me, ok := e.(serf.MemberEvent)
			if !ok {
				continue
			}
			for _, m := range me.Members {
				at, _ := DecodeAgentTags(m.Tags)
				switch me.Type {
				case serf.EventMemberFailed:
					failed = append(failed, at)
				case serf.EventMemberLeave:
					left = append(left, at)
				}
			}
		}
	}
	took := time.Since(t0)
	t.Logf("crash seen as failed after %v", took.Round(time.Millisecond))
	if len(failed) != 1 || failed[0].NodeID != "n1" || failed[0].Epoch != 7 || failed[0].Free.Tasks != 2 {
		t.Fatalf("failed members %+v, want n1 at epoch 7 only (left: %+v)", failed, left)
	}
	if len(left) != 1 || left[0].NodeID != "n2" {
		t.Fatalf("left members %+v, want n2", left)
	}
	if took > 4*time.Second {
		t.Fatalf("detection took %v; the tuned timings give about 1 s", took)
	}
}
