package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/testutil"
)

// TestKeygenPrintsANewKey: one line, standard base64 of 32 bytes, a
// different key each run.
func TestKeygenPrintsANewKey(t *testing.T) {
	var keys []string
	for range 2 {
		r := runCLI(t, nil, "keygen")
		k, err := base64.StdEncoding.DecodeString(strings.TrimSuffix(r.stdout, "\n"))
		if r.code != 0 || err != nil || len(k) != 32 || strings.Count(r.stdout, "\n") != 1 {
			t.Fatalf("keygen: exit %d, %d bytes (%v)\n%q\n%s", r.code, len(k), err, r.stdout, r.stderr)
		}
		keys = append(keys, r.stdout)
	}
	if keys[0] == keys[1] {
		t.Fatal("keygen printed the same key twice")
	}
}

// TestKeyringFlagErrorsExit2: a malformed --gossip-key or
// $APIARY_GOSSIP_KEY stops a server role at once (exit 2, naming where the
// key came from, never quoting it); `apiary keyring` refuses a malformed
// KEY or --pool before dialing; a server that does not serve GossipKeyring
// (as the router) gets an answer pointing at the coordinators.
func TestKeyringFlagErrorsExit2(t *testing.T) {
	dir := t.TempDir()
	bad := base64.StdEncoding.EncodeToString([]byte("twenty bytes of key!"))
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, regionArgs(t, dir, "--gossip-key", bad), "--gossip-key: a key must be 16, 24 or 32 bytes, this one is 20"},
		{[]string{EnvGossipKey + "=" + bad}, regionArgs(t, dir), "$APIARY_GOSSIP_KEY: a key must be 16, 24 or 32 bytes"},
		{[]string{EnvGossipKey + "=not base64!"}, []string{"agent", "--insecure-dev", "--addr", closedAddr(t), "--data-dir", dir},
			"$APIARY_GOSSIP_KEY: not standard base64"},
		{nil, []string{"global", "--insecure-dev", "--gossip-key", "", "--listen", testutil.FreeAddr(t)}, "--gossip-key: empty key"},
	} {
		r := runCLI(t, tc.env, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, bad) {
			t.Errorf("%v %v: exit %d, want 2 and %q:\n%s", tc.env, tc.args[:1], r.code, tc.want, r.stderr)
		}
	}
	addr, dials := countingListener(t)
	for _, args := range [][]string{{"install", "c2hvcnQ="}, {"use", "not base64"}, {"list", "--pool", "lan,wan"}} {
		r := runCLI(t, nil, append([]string{"keyring", "--addr", addr}, args...)...)
		if r.code != 2 || dials.Load() != 0 {
			t.Errorf("keyring %v: exit %d after %d dials, want 2 and none:\n%s", args, r.code, dials.Load(), r.stderr)
		}
	}
	if r := runCLIInput(t, "c2hvcnQ=\n", nil, "keyring", "--addr", addr, "install", "-"); r.code != 2 || dials.Load() != 0 ||
		!strings.Contains(r.stderr, "KEY:") {
		t.Errorf("keyring install - with a short key on stdin: exit %d after %d dials, want 2 and none:\n%s", r.code, dials.Load(), r.stderr)
	}
	_, fake := startFake(t) // AdminService without GossipKeyring, as the router's
	r := runCLI(t, nil, "keyring", "list", "--addr", fake)
	if r.code != 2 || !strings.Contains(r.stderr, "a global router does not") || !strings.Contains(r.stderr, "give --addr of a region's coordinators") {
		t.Errorf("keyring list at a server without GossipKeyring: exit %d\n%s", r.code, r.stderr)
	}
}

// keyringJSON runs `apiary keyring ARGS -o json --addr api`.
func keyringJSON(t *testing.T, api string, args ...string) (*apiaryv1.GossipKeyringResponse, cliResult) {
	t.Helper()
	return keyringJSONInput(t, "", api, args...)
}

// keyringJSONInput is keyringJSON with stdin as the command's input.
func keyringJSONInput(t *testing.T, stdin, api string, args ...string) (*apiaryv1.GossipKeyringResponse, cliResult) {
	t.Helper()
	r := runCLIInput(t, stdin, nil, append(append([]string{"keyring"}, args...), "-o", "json", "--addr", api)...)
	out := &apiaryv1.GossipKeyringResponse{}
	if r.code == 0 {
		if err := protojson.Unmarshal([]byte(r.stdout), out); err != nil {
			t.Fatalf("keyring %v: %v\n%s", args, err, r.stdout)
		}
	}
	return out, r
}

// poolOf returns the response's entry for pool.
func poolOf(resp *apiaryv1.GossipKeyringResponse, pool string) *apiaryv1.GossipKeyringPool {
	for _, p := range resp.GetPools() {
		if p.GetPool() == pool {
			return p
		}
	}
	return nil
}

func keyringFile(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := json.Unmarshal(b, &keys); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return keys
}

// TestKeyringRotationThroughTheCLI: a real coordinator (LAN and WAN pools)
// and a real agent, both given the key through $APIARY_GOSSIP_KEY; the
// agent joins the encrypted LAN pool and its tasks do not inherit the key;
// `apiary keyring install/use/remove` rotates it on both pools (each step
// answered by every member) and every keyring file follows; removing the
// key in use is refused by the members (exit 1, each one's message).
func TestKeyringRotationThroughTheCLI(t *testing.T) {
	oldKey := runCLI(t, nil, "keygen").stdout
	oldKey = strings.TrimSpace(oldKey)
	t.Setenv(EnvGossipKey, oldKey) // inherited by the region and the agent
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	api := testutil.FreeAddr(t)
	rargs := regionArgs(t, dir, "--ready-file", ready, "--lan-addr", "127.0.0.1:0", "--wan-bind", testutil.FreeAddr(t))
	rargs[slices.Index(rargs, "--listen")+1] = api
	rp := startProc(t, rargs...)
	waitFile(t, rp, ready)
	startProc(t, "agent", "--insecure-dev", "--addr", api, "--node-id", "n1", "--data-dir", filepath.Join(dir, "n1"),
		"--cpu-millis", "1000", "--memory-mb", "1024", "--lan-addr", "127.0.0.1:0")

	testutil.Eventually(t, 30*time.Second, "the agent in the encrypted LAN pool", func() error {
		resp, r := keyringJSON(t, api, "list")
		if r.code != 0 {
			return fmt.Errorf("exit %d: %s", r.code, r.stderr)
		}
		if lan := poolOf(resp, "lan"); lan.GetMembers() != 2 || lan.GetKeys()[oldKey] != 2 {
			return fmt.Errorf("LAN pool: %d members, key held by %d", lan.GetMembers(), lan.GetKeys()[oldKey])
		}
		return nil
	})

	// A task's environment does not hold the key.
	out := filepath.Join(dir, "task-env")
	job := filepath.Join(dir, "env.yaml")
	if err := os.WriteFile(job, []byte(fmt.Sprintf("name: env\ntasks:\n  - name: t\n    command: sh\n    args: [\"-c\", \"env > %s.tmp && mv %s.tmp %s\"]\n", out, out, out)), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, nil, "job", "run", job, "--wait", "--addr", api); r.code != 0 {
		t.Fatalf("job run: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	env, err := os.ReadFile(out)
	if err != nil || !strings.Contains(string(env), "APIARY_JOB_ID=") {
		t.Fatalf("task env: %v\n%s", err, env)
	}
	if strings.Contains(string(env), EnvGossipKey) || strings.Contains(string(env), oldKey) {
		t.Fatalf("the task inherited the gossip key:\n%s", env)
	}

	newKey := strings.TrimSpace(runCLI(t, nil, "keygen").stdout)
	want := map[string]int32{"lan": 2, "wan": 1}
	for _, step := range [][]string{{"install", "-"}, {"use", newKey}, {"remove", oldKey}} {
		resp, r := keyringJSONInput(t, newKey+"\n", api, step...) // install reads the key from stdin
		if r.code != 0 || len(resp.GetPools()) != 2 {
			t.Fatalf("keyring %s: exit %d\n%s\n%s", step[0], r.code, r.stdout, r.stderr)
		}
		for pool, n := range want {
			if p := poolOf(resp, pool); p.GetMembers() != n || p.GetResponses() != n || p.GetFailures() != 0 || p.GetError() != "" {
				t.Fatalf("keyring %s, %s pool: %v", step[0], pool, p)
			}
		}
	}
	resp, _ := keyringJSON(t, api, "list")
	for pool, n := range want {
		if p := poolOf(resp, pool); len(p.GetKeys()) != 1 || p.GetKeys()[newKey] != n || p.GetPrimaryKeys()[newKey] != n {
			t.Fatalf("%s pool after the rotation: keys %d, new key held by %d, primary for %d (want %d)",
				pool, len(p.GetKeys()), p.GetKeys()[newKey], p.GetPrimaryKeys()[newKey], n)
		}
	}
	for _, f := range []string{filepath.Join(dir, "etcd", "gossip.keyring"), filepath.Join(dir, "etcd", "gossip.keyring.wan"),
		filepath.Join(dir, "n1", "gossip.keyring")} {
		if got := keyringFile(t, f); !slices.Equal(got, []string{newKey}) {
			t.Fatalf("%s holds %d keys after the rotation, want the new one alone", f, len(got))
		}
	}
	// The key in use cannot be removed: every member says so.
	r := runCLI(t, nil, "keyring", "remove", newKey, "--pool", "lan", "--addr", api)
	if r.code != 1 || strings.Count(r.stdout, "removing the primary key is not allowed") != 2 || !strings.Contains(r.stderr, "not every member applied it") {
		t.Fatalf("removing the key in use: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}
