package regional_test

// Issue 19, gossip encryption: a region, its agents and a router whose serf
// pools (LAN and WAN) are encrypted with a key (`--gossip-key`, devcluster
// Options.GossipKey) run jobs end to end; a serf member without the key
// (or with another) cannot join either pool; the key is rotated through
// `apiary keyring install/use/remove` with every member staying alive, the
// keyring files follow, and the pool still detects a crash (fast reclaim)
// afterwards; with TLS and no key every process warns that gossip is
// unencrypted, with --insecure-dev none does.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/lan"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

// gossipCluster starts one region of one coordinator (LAN pool, /metrics
// at the returned address, an 8 s node lease so that only the pool can
// move a task quickly, no failover grace) and two agents, plus a global
// router (WAN pool), with opts' TLS and gossip key, in dir.
func gossipCluster(t *testing.T, dir string, tls bool, key string) (*devcluster.Cluster, *devcluster.Region, string) {
	t.Helper()
	metrics := testutil.FreeAddr(t)
	rs := devcluster.RegionSpec{Name: "eu-west", Jurisdiction: "eu", Agents: twoAgents(), ExtraArgs: []string{
		"--node-lease-ttl", lanLease.String(), "--failover-grace", "0s", "--metrics-addr", metrics}}
	bin := testutil.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl := startCluster(t, ctx, devcluster.Options{Binary: bin, Dir: dir, Regions: []devcluster.RegionSpec{rs},
		Global: &devcluster.GlobalSpec{}, TLS: tls, GossipKey: key})
	return cl, cl.Regions[0], metrics
}

// serfMembers is the coordinator's apiary_serf_members{pool,state}.
func serfMembers(t *testing.T, metrics, pool, state string) int {
	t.Helper()
	f := testutil.ScrapeMetrics(t, "http://"+metrics+"/metrics")["apiary_serf_members"]
	if f == nil {
		return 0
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["pool"] == pool && labels["state"] == state {
			return int(m.GetGauge().GetValue())
		}
	}
	return 0
}

// poolsWhole waits until the coordinator counts want alive members in its
// LAN pool and 2 (itself and the router) in its WAN pool, and no failed
// one in either.
func poolsWhole(t *testing.T, metrics string, lanAlive int, what string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, what, func() error {
		la, lf := serfMembers(t, metrics, "lan", "alive"), serfMembers(t, metrics, "lan", "failed")
		wa, wf := serfMembers(t, metrics, "wan", "alive"), serfMembers(t, metrics, "wan", "failed")
		if la != lanAlive || lf != 0 || wa != 2 || wf != 0 {
			return fmt.Errorf("LAN alive %d failed %d (want %d, 0); WAN alive %d failed %d (want 2, 0)", la, lf, lanAlive, wa, wf)
		}
		return nil
	})
}

// keyring runs `apiary keyring ARGS -o json --addr addr` and decodes the
// answer; a non-zero exit fails the test.
func keyring(t *testing.T, env []string, addr string, args ...string) *apiaryv1.GossipKeyringResponse {
	t.Helper()
	res := runBin(t, env, append(append([]string{"keyring"}, args...), "-o", "json", "--addr", addr)...)
	if res.code != 0 {
		t.Fatalf("apiary keyring %v: exit %d\n%s\n%s", args, res.code, res.stdout, res.stderr)
	}
	out := &apiaryv1.GossipKeyringResponse{}
	if err := protojson.Unmarshal([]byte(res.stdout), out); err != nil {
		t.Fatalf("apiary keyring %v: %v\n%s", args, err, res.stdout)
	}
	return out
}

// checkPools checks that the response covers the LAN pool (lanMembers
// members) and the WAN pool (2), every member answering with success, and,
// for a list, that each holds exactly keys with primary the one in use.
func checkPools(t *testing.T, what string, resp *apiaryv1.GossipKeyringResponse, lanMembers int, keys []string, primary string) {
	t.Helper()
	want := map[string]int32{"lan": int32(lanMembers), "wan": 2}
	if len(resp.GetPools()) != 2 {
		t.Fatalf("%s: pools %v", what, resp.GetPools())
	}
	for _, p := range resp.GetPools() {
		n, ok := want[p.GetPool()]
		if !ok || p.GetMembers() != n || p.GetResponses() != n || p.GetFailures() != 0 || p.GetError() != "" {
			t.Fatalf("%s: pool %s: %d members, %d responses, %d failures (want %d, all with success): %q %v",
				what, p.GetPool(), p.GetMembers(), p.GetResponses(), p.GetFailures(), n, p.GetError(), p.GetMessages())
		}
		if keys == nil {
			continue
		}
		var got []string
		for k, c := range p.GetKeys() {
			if c != n {
				t.Fatalf("%s: pool %s: key %s held by %d of %d members", what, p.GetPool(), k[:8], c, n)
			}
			got = append(got, k)
		}
		slices.Sort(got)
		if !slices.Equal(got, slices.Sorted(slices.Values(keys))) || p.GetPrimaryKeys()[primary] != n || len(p.GetPrimaryKeys()) != 1 {
			t.Fatalf("%s: pool %s holds %d keys (want %d), primary counts %v", what, p.GetPool(), len(got), len(keys), len(p.GetPrimaryKeys()))
		}
	}
}

// rogue starts a serf member on loopback with the LAN pool's tuned
// configuration and g's encryption, tagged as an agent of node id, and
// tries to join addr; it returns the member and whether the join got
// through.
func rogue(t *testing.T, id, addr string, g federation.Gossip) (*serf.Serf, bool) {
	t.Helper()
	tags, err := lan.AgentTags{NodeID: id, Epoch: 1}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	conf, err := lan.NewSerfConfig(lan.MemberConfig{Name: lan.MemberName(lan.RoleAgent, id), Bind: "127.0.0.1:0", Tags: tags, Gossip: g})
	if err != nil {
		t.Fatal(err)
	}
	conf.LogOutput, conf.MemberlistConfig.LogOutput = io.Discard, io.Discard
	s, err := serf.Create(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	n, err := s.Join([]string{addr}, true)
	return s, err == nil && n > 0
}

// rogueRefused: members without the pool's key (none, or another) are
// refused by the coordinator's LAN member and by the router's WAN member,
// and over a second (many gossip rounds) never learn of any other member
// nor reach the coordinator's count of members.
func rogueRefused(t *testing.T, r *devcluster.Region, cl *devcluster.Cluster, metrics string, lanAlive int, keys map[string][]byte) {
	t.Helper()
	var rogues []*serf.Serf
	for name, k := range keys {
		for _, target := range []struct{ pool, addr string }{{"LAN", r.LANAddrs[0]}, {"WAN", cl.GlobalWAN}} {
			s, joined := rogue(t, "rogue-"+name, target.addr, federation.Gossip{Key: k})
			if joined {
				t.Fatalf("a serf member with %s joined the %s pool at %s", name, target.pool, target.addr)
			}
			rogues = append(rogues, s)
		}
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		for _, s := range rogues {
			if ms := s.Members(); len(ms) != 1 {
				t.Fatalf("rogue %s learned of members: %v", s.LocalMember().Name, ms)
			}
		}
	}
	poolsWhole(t, metrics, lanAlive, "pools without the rogues")
}

// TestGossipEncryptedRegionEndToEnd, with mutual TLS and a gossip key on
// every process (one coordinator, two agents, a router):
//   - a job runs; both pools are whole (LAN: 3 alive, WAN: 2); every
//     process keeps its keyring file; no process warns of plain gossip;
//   - serf members without the key, or with another one, are not admitted
//     to the LAN pool (at the coordinator's LAN address) nor to the WAN
//     pool (at the router's), and never see a member;
//   - `apiary keyring list/install/use/remove` (client certificate)
//     rotates the key of both pools: each step reaches every member, the
//     pools stay whole, the keyring files hold the new key alone, and a
//     member with the old key is refused afterwards; the router refuses
//     the command pointing at the coordinators, and a router certificate
//     calling the coordinator is denied;
//   - an agent restarted with the old key on its command line rejoins
//     from its rotated keyring file, and a crash of the agent running a
//     task is still seen through the pool: the task runs again on the
//     other node within 6 s, inside the 8 s node lease (fast
//     reclaim).
func TestGossipEncryptedRegionEndToEnd(t *testing.T) {
	oldKey, err := federation.GenerateGossipKey()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cl, r, metrics := gossipCluster(t, dir, true, oldKey)
	c := dial(t, r)
	env := cl.ClientEnv()

	id := submit(t, c, spec(t, "name: hello\ntasks:\n  - name: t\n    command: \"true\"\n    count: 2\n"))
	waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	poolsWhole(t, metrics, 3, "pools whole with the key")
	keyringFiles := []string{filepath.Join(dir, "eu-west-c1", "gossip.keyring"), filepath.Join(dir, "eu-west-c1", "gossip.keyring.wan"),
		filepath.Join(dir, "n1", "gossip.keyring"), filepath.Join(dir, "n2", "gossip.keyring"), filepath.Join(dir, "global-1.keyring")}
	checkFiles := func(want string) {
		t.Helper()
		for _, f := range keyringFiles {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			if err := json.Unmarshal(b, &keys); err != nil || !slices.Equal(keys, []string{want}) {
				t.Fatalf("%s holds %d keys (%v), want the one key in use", f, len(keys), err)
			}
		}
	}
	checkFiles(oldKey)
	for _, p := range append(procs(cl), cl.Global) {
		b, _ := os.ReadFile(p.LogPath)
		if bytes.Contains(b, []byte("gossip is unencrypted")) || !bytes.Contains(b, []byte("gossip encrypted")) {
			t.Fatalf("%s's log: want \"gossip encrypted\" and no warning of plain gossip", p.Name)
		}
	}

	_, other := mustKey(t)
	rogueRefused(t, r, cl, metrics, 3, map[string][]byte{"no key": nil, "another key": other})

	// Rotation through the coordinator, as an operator.
	checkPools(t, "list", keyring(t, env, r.Addr(), "list"), 3, []string{oldKey}, oldKey)
	newKey, _ := mustKey(t)
	checkPools(t, "install", keyring(t, env, r.Addr(), "install", newKey), 3, nil, "")
	poolsWhole(t, metrics, 3, "pools whole after install")
	checkPools(t, "list after install", keyring(t, env, r.Addr(), "list"), 3, []string{oldKey, newKey}, oldKey)
	checkPools(t, "use", keyring(t, env, r.Addr(), "use", newKey), 3, nil, "")
	poolsWhole(t, metrics, 3, "pools whole after use")
	checkPools(t, "remove", keyring(t, env, r.Addr(), "remove", oldKey), 3, nil, "")
	poolsWhole(t, metrics, 3, "pools whole after remove")
	checkPools(t, "list after rotation", keyring(t, env, r.Addr(), "list"), 3, []string{newKey}, newKey)
	checkFiles(newKey)
	res := runBin(t, env, "keyring", "list", "--addr", r.Addr())
	if res.code != 0 || !strings.Contains(res.stdout, "LAN pool: 3 members, 3 answered") || !strings.Contains(res.stdout, newKey) {
		t.Fatalf("keyring list (text): exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	oldRaw, _ := federation.DecodeGossipKey(oldKey)
	rogueRefused(t, r, cl, metrics, 3, map[string][]byte{"the removed key": oldRaw})

	// Not through the router, and not as a router.
	res = runBin(t, env, "keyring", "list", "--addr", cl.GlobalAddr)
	if res.code != 2 || !strings.Contains(res.stderr, "does not manage the gossip keyring") || !strings.Contains(res.stderr, "coordinators") {
		t.Errorf("keyring list via the router: exit %d\n%s", res.code, res.stderr)
	}
	routerFiles, err := cl.PKI().Cert(pki.RoleRouter, pki.GlobalRegion, "global-1")
	if err != nil {
		t.Fatal(err)
	}
	rel, err := pki.NewReloader(pki.ReloaderConfig{CAFile: routerFiles.CA, CertFile: routerFiles.Cert, KeyFile: routerFiles.Key})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := cliconn.DialTLS(r.Addr(), rel, pki.RegionServerName(r.Spec.Name))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	_, err = apiaryv1.NewAdminServiceClient(conn).GossipKeyring(ctx, &apiaryv1.GossipKeyringRequest{Op: apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_LIST})
	cancel()
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "only client certificates (operators) can") {
		t.Errorf("GossipKeyring as the router: %v; want PermissionDenied for a router certificate", err)
	}
	// A bad key is refused by the CLI before any call.
	if res := runBin(t, env, "keyring", "install", "c2hvcnQ=", "--addr", r.Addr()); res.code != 2 || !strings.Contains(res.stderr, "KEY:") {
		t.Errorf("install of a 5-byte key: exit %d\n%s", res.code, res.stderr)
	}

	// n2 restarts; its command line still says the old key, its keyring
	// file the new one: it rejoins.
	n2 := r.Agent("n2")
	n2.Stop(10 * time.Second)
	poolsWhole(t, metrics, 2, "n2 left the LAN pool")
	if err := n2.Start(); err != nil {
		t.Fatal(err)
	}
	poolsWhole(t, metrics, 3, "n2 back in the LAN pool under the new key")
	if err := r.WaitNodes(t.Context(), 2); err != nil {
		t.Fatal(err)
	}

	// The pool still detects a crash.
	gate := t.TempDir()
	gid := submit(t, c, spec(t, gatedJob(gate, 1, "max_attempts: 3")))
	first := waitAttemptRunning(t, c, gid, 0, 1, 20*time.Second)
	before := fastReclaims(t, metrics)
	if err := r.Agent(first.GetNodeId()).Kill(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	second := waitAttemptRunning(t, c, gid, 0, 2, lanDeadline)
	t.Logf("after the rotation: SIGKILL of %s → attempt 2 RUNNING on %s after %v (node lease %v)",
		first.GetNodeId(), second.GetNodeId(), time.Since(t0).Round(time.Millisecond), lanLease)
	if n := fastReclaims(t, metrics); n <= before {
		t.Fatalf("apiary_lan_fast_reclaims_total = %v (was %v): the task moved, but not by the pool", n, before)
	}
	openGate(t, gate)
	waitState(t, c, gid, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
}

func mustKey(t *testing.T) (string, []byte) {
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

// TestGossipUnencryptedWarnings: with mutual TLS and no gossip key, the
// coordinator (for its LAN and WAN members), the agents and the router
// each log a WARN that gossip is unencrypted, and still run a job; with
// --insecure-dev and no key, none does.
func TestGossipUnencryptedWarnings(t *testing.T) {
	for _, tls := range []bool{true, false} {
		cl, r, _ := gossipCluster(t, t.TempDir(), tls, "")
		c := dial(t, r)
		id := submit(t, c, spec(t, "name: hello\ntasks:\n  - name: t\n    command: \"true\"\n"))
		waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
		for _, p := range append(procs(cl), cl.Global) {
			b, _ := os.ReadFile(p.LogPath)
			warns := 0
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "gossip is unencrypted") && strings.Contains(line, "level=WARN") {
					warns++
				}
			}
			want := 0
			if tls {
				want = 1
				if strings.HasPrefix(p.Name, "eu-west-c") {
					want = 2 // LAN and WAN members
				}
			}
			if warns != want {
				t.Errorf("TLS %v: %s logged %d warnings of plain gossip, want %d", tls, p.Name, warns, want)
			}
		}
		cl.Stop()
	}
}
