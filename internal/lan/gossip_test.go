package lan

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"

	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/testutil"
)

// notAKeyring is a file that exists and is not a keyring.
func notAKeyring(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "bad.keyring")
	if err := os.WriteFile(p, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func newKey(t *testing.T) (string, []byte) {
	t.Helper()
	s, err := federation.GenerateGossipKey()
	if err != nil {
		t.Fatal(err)
	}
	b, err := federation.DecodeGossipKey(s)
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

// keyed is create with a gossip keyring.
func keyed(t *testing.T, name string, tags map[string]string, g federation.Gossip) *serf.Serf {
	t.Helper()
	conf, err := NewSerfConfig(MemberConfig{Name: name, Bind: "127.0.0.1:0", Tags: tags, Gossip: g})
	if err != nil {
		t.Fatal(err)
	}
	conf.LogOutput, conf.MemberlistConfig.LogOutput = io.Discard, io.Discard
	s, err := serf.Create(conf)
	if err != nil {
		t.Fatalf("serf.Create %s: %v", name, err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	return s
}

// aliveTags returns the tags of the alive member whose node tag is node, or nil.
func aliveTags(s *serf.Serf, node string) map[string]string {
	for _, m := range s.Members() {
		if t, ok := DecodeAgentTags(m.Tags); ok && t.NodeID == node && m.Status == serf.StatusAlive {
			return m.Tags
		}
	}
	return nil
}

func names(s *serf.Serf) []string {
	var out []string
	for _, m := range s.Members() {
		out = append(out, m.Name+"="+m.Status.String())
	}
	slices.Sort(out)
	return out
}

// TestGossipKeyAdmitsAndRefuses: in a real pool on loopback whose
// coordinator holds a key, a member with the same key joins and each side
// reads the other's tags; a member without a key and one with another key
// are refused at join, and for a while afterwards (many gossip rounds and
// probes) neither is ever listed by the pool nor lists the coordinator: it
// never reads its tags.
func TestGossipKeyAdmitsAndRefuses(t *testing.T) {
	_, key := newKey(t)
	_, wrong := newKey(t)
	ct, _ := CoordinatorTags{ID: "c1"}.Encode()
	coord := keyed(t, MemberName(RoleCoordinator, "c1"), ct, federation.Gossip{Key: key})
	if !coord.EncryptionEnabled() {
		t.Fatal("a member made with a key has no keyring")
	}
	at, _ := AgentTags{NodeID: "good", Epoch: 3}.Encode()
	good := keyed(t, MemberName(RoleAgent, "good"), at, federation.Gossip{Key: key})
	if n, err := good.Join([]string{Addr(coord.LocalMember())}, true); err != nil || n != 1 {
		t.Fatalf("keyed member's join: %d, %v", n, err)
	}
	testutil.Eventually(t, 5*time.Second, "keyed member and coordinator see each other's tags", func() error {
		if aliveTags(coord, "good") == nil {
			return fmt.Errorf("coordinator's members: %v", names(coord))
		}
		for _, m := range good.Members() {
			if c, ok := DecodeCoordinatorTags(m.Tags); ok && c.ID == "c1" && m.Status == serf.StatusAlive {
				return nil
			}
		}
		return fmt.Errorf("keyed member's members: %v", names(good))
	})

	rogues := map[string]*serf.Serf{}
	for name, g := range map[string]federation.Gossip{"keyless": {}, "wrongkey": {Key: wrong}} {
		tags, _ := AgentTags{NodeID: name, Epoch: 1}.Encode()
		r := keyed(t, MemberName(RoleAgent, name), tags, g)
		if r.EncryptionEnabled() != (g.Key != nil) {
			t.Fatalf("%s member: encryption %v", name, r.EncryptionEnabled())
		}
		if n, err := r.Join([]string{Addr(coord.LocalMember())}, true); err == nil || n != 0 {
			t.Errorf("%s member joined the keyed pool: %d, %v", name, n, err)
		}
		rogues[name] = r
	}
	// Absence over time: 2 s is 10 probe intervals and 40 gossip rounds,
	// and the keyed member keeps its place throughout.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for name, r := range rogues {
			if tags := aliveTags(coord, name); tags != nil || len(coord.Members()) != 2 {
				t.Fatalf("the coordinator lists the %s member: %v", name, names(coord))
			}
			if len(r.Members()) != 1 {
				t.Fatalf("the %s member sees the pool: %v", name, names(r))
			}
			for _, m := range r.Members() {
				if _, ok := DecodeCoordinatorTags(m.Tags); ok {
					t.Fatalf("the %s member read the coordinator's tags: %v", name, m.Tags)
				}
			}
		}
		if aliveTags(coord, "good") == nil {
			t.Fatalf("the keyed member dropped out: %v", names(coord))
		}
	}
}

// readKeyring reads a keyring file serf wrote: base64 keys, primary first.
func readKeyring(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := json.Unmarshal(data, &keys); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return keys
}

// TestKeyringRotationKeepsThePoolWhole: serf's rotation (install the new
// key everywhere, make it primary, remove the old one) through the
// KeyManager of one member of a 3-member pool keeps every member alive and
// gossiping (a tag change made after it reaches the others), rewrites
// every member's keyring file to the new key alone, and afterwards a member
// that holds only the old key is refused while one restarted from its
// rotated keyring file (given the old key too: the file wins) joins.
func TestKeyringRotationKeepsThePoolWhole(t *testing.T) {
	oldS, oldK := newKey(t)
	newS, _ := newKey(t)
	dir := t.TempDir()
	var members []*serf.Serf
	var files []string
	for i := 1; i <= 3; i++ {
		f := filepath.Join(dir, fmt.Sprintf("n%d", i), "lan.keyring")
		tags, _ := AgentTags{NodeID: fmt.Sprintf("n%d", i), Epoch: 1}.Encode()
		m := keyed(t, MemberName(RoleAgent, fmt.Sprintf("n%d", i)), tags, federation.Gossip{Key: oldK, KeyringFile: f})
		if got := readKeyring(t, f); !slices.Equal(got, []string{oldS}) {
			t.Fatalf("n%d's keyring file at start: %v", i, got)
		}
		if i > 1 {
			if _, err := m.Join([]string{Addr(members[0].LocalMember())}, true); err != nil {
				t.Fatal(err)
			}
		}
		members, files = append(members, m), append(files, f)
	}
	allAlive := func() error {
		for _, m := range members {
			for i := 1; i <= 3; i++ {
				if aliveTags(m, fmt.Sprintf("n%d", i)) == nil {
					return fmt.Errorf("%s sees %v", m.LocalMember().Name, names(m))
				}
			}
		}
		return nil
	}
	testutil.Eventually(t, 5*time.Second, "3 members alive", allAlive)

	km := members[0].KeyManager()
	for _, step := range []struct {
		what string
		do   func(string) (*serf.KeyResponse, error)
		key  string
	}{{"install", km.InstallKey, newS}, {"use", km.UseKey, newS}, {"remove", km.RemoveKey, oldS}} {
		resp, err := step.do(step.key)
		if err != nil || resp.NumResp != 3 || resp.NumErr != 0 {
			t.Fatalf("%s: %v (responses %d of %d, errors %d: %v)", step.what, err, resp.NumResp, resp.NumNodes, resp.NumErr, resp.Messages)
		}
		if err := allAlive(); err != nil {
			t.Fatalf("after %s: %v", step.what, err)
		}
	}
	list, err := km.ListKeys()
	if err != nil || len(list.Keys) != 1 || list.Keys[newS] != 3 || list.PrimaryKeys[newS] != 3 {
		t.Fatalf("list after rotation: %v keys %v primary %v", err, list.Keys, list.PrimaryKeys)
	}
	for i, f := range files {
		if got := readKeyring(t, f); !slices.Equal(got, []string{newS}) {
			t.Fatalf("n%d's keyring file after rotation holds %d keys (want the new one alone)", i+1, len(got))
		}
	}
	// Gossip still flows under the new key: a tag change reaches the others.
	t3, _ := AgentTags{NodeID: "n3", Epoch: 9}.Encode()
	if err := members[2].SetTags(t3); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "n3's new epoch seen by n1", func() error {
		if tags := aliveTags(members[0], "n3"); tags[TagEpoch] != "9" {
			return fmt.Errorf("n1 sees n3's tags %v", tags)
		}
		return nil
	})

	// Only the old key: refused.
	tags, _ := AgentTags{NodeID: "stale", Epoch: 1}.Encode()
	stale := keyed(t, MemberName(RoleAgent, "stale"), tags, federation.Gossip{Key: oldK})
	if n, err := stale.Join([]string{Addr(members[0].LocalMember())}, true); err == nil || n != 0 {
		t.Fatalf("a member with the removed key joined: %d, %v", n, err)
	}
	// n2 restarts from its keyring file (its command line still says the
	// old key): the file wins and it joins.
	if err := members[1].Shutdown(); err != nil {
		t.Fatal(err)
	}
	tags, _ = AgentTags{NodeID: "n2b", Epoch: 2}.Encode()
	n2b := keyed(t, MemberName(RoleAgent, "n2b"), tags, federation.Gossip{Key: oldK, KeyringFile: files[1]})
	if n, err := n2b.Join([]string{Addr(members[0].LocalMember())}, true); err != nil || n != 1 {
		t.Fatalf("restarted member with the rotated keyring file: %d, %v", n, err)
	}
	testutil.Eventually(t, 5*time.Second, "restarted member seen by n1", func() error {
		if aliveTags(members[0], "n2b") == nil {
			return fmt.Errorf("n1 sees %v", names(members[0]))
		}
		return nil
	})
}
