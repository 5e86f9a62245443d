package main

// ACL tokens end to end (issue 19 items 4 and 5), as a user runs them: real
// regions with --acl and mutual TLS, a real router, real agents, and this
// CLI. The router forwards the caller's token and fans ACL writes out; the
// regions decide.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
)

// aclCluster starts regions with mutual TLS and ACLs (devcluster
// bootstraps them and gives every agent a join token), with a global
// router when global is set, and stops it at test end (logging every
// process's log tail if the test failed).
func aclCluster(t *testing.T, global bool, regions ...devcluster.RegionSpec) *devcluster.Cluster {
	t.Helper()
	for i := range regions {
		regions[i].ExtraArgs = append(regions[i].ExtraArgs, "--node-lease-ttl", "1s")
	}
	opts := devcluster.Options{Binary: testutil.Binary(t), Dir: t.TempDir(), Regions: regions, TLS: true, ACL: true}
	if global {
		opts.Global = &devcluster.GlobalSpec{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, err := devcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl.Stop()
		if !t.Failed() {
			return
		}
		procs := []*devcluster.Proc{}
		if cl.Global != nil {
			procs = append(procs, cl.Global)
		}
		for _, r := range cl.Regions {
			procs = append(append(procs, r.Coords...), r.Agents...)
		}
		for _, p := range procs {
			if b, err := os.ReadFile(p.LogPath); err == nil {
				t.Logf("--- %s log tail ---\n%s", p.Name, b[max(0, len(b)-4000):])
			}
		}
	})
	return cl
}

// withToken is env (the cluster's client environment) with APIARY_TOKEN
// set to secret ("": no token at all).
func withToken(env []string, secret string) []string {
	out := slices.DeleteFunc(slices.Clone(env), func(e string) bool { return strings.HasPrefix(e, acl.EnvToken+"=") })
	if secret != "" {
		out = append(out, acl.EnvToken+"="+secret)
	}
	return out
}

// mustCLI runs the CLI and fails the test unless it exits 0.
func mustCLI(t *testing.T, env []string, args ...string) cliResult {
	t.Helper()
	r := runCLI(t, env, args...)
	if r.code != 0 {
		t.Fatalf("apiary %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// wantRefused runs the CLI and fails the test unless it exits 2 with every
// one of want in its stderr.
func wantRefused(t *testing.T, env []string, want []string, args ...string) {
	t.Helper()
	r := runCLI(t, env, args...)
	ok := r.code == exitInvalid
	for _, w := range want {
		ok = ok && strings.Contains(r.stderr, w)
	}
	if !ok {
		t.Errorf("apiary %s: exit %d, want 2 saying %q\n%s%s", strings.Join(args, " "), r.code, want, r.stdout, r.stderr)
	}
}

// tokenJSON runs `acl token create ... -o json` and returns the token.
func tokenJSON(t *testing.T, env []string, args ...string) *apiaryv1.ACLToken {
	t.Helper()
	r := mustCLI(t, env, append([]string{"acl", "token", "create", "-o", "json"}, args...)...)
	var resp apiaryv1.CreateACLTokenResponse
	if err := protojson.Unmarshal([]byte(r.stdout), &resp); err != nil || resp.GetToken().GetSecretId() == "" {
		t.Fatalf("acl token create: %v\n%s", err, r.stdout)
	}
	return resp.GetToken()
}

// tokenNames lists the names of the tokens a region (or the router) at
// addr holds, as the management token sees them.
func tokenNames(t *testing.T, env []string, addr string) []string {
	t.Helper()
	r := mustCLI(t, env, "acl", "token", "list", "-o", "json", "--addr", addr)
	var resp apiaryv1.ListACLTokensResponse
	if err := protojson.Unmarshal([]byte(r.stdout), &resp); err != nil {
		t.Fatalf("acl token list: %v\n%s", err, r.stdout)
	}
	var names []string
	for _, tok := range resp.GetTokens() {
		names = append(names, tok.GetName())
	}
	return names
}

const sleepJob = "name: %s\ntasks:\n  - name: t\n    command: sleep\n    args: [\"30\"]\n"

// TestACLThroughRouter: with mutual TLS and ACLs on, through the router:
// the bootstrap (devcluster's, through the router) cannot be repeated with
// other ids; a policy applied and a client token made through the router
// work in every region; a token for namespace a submits, reads, lists and
// cancels there and is refused for namespace b (get, cancel, logs, list,
// submit), with the hint; a token the regions do not know, or none, is
// refused through the router as by the regions (the router never
// widens); and a token is made in every region or in none, when a region
// refuses it and when a region is down.
func TestACLThroughRouter(t *testing.T) {
	agent := func(id string) []devcluster.AgentSpec {
		return []devcluster.AgentSpec{{ID: id, CPUMillis: 2000, MemoryMiB: 2048}}
	}
	cl := aclCluster(t, true,
		devcluster.RegionSpec{Name: "eu-west", Jurisdiction: "eu", Agents: agent("eu-n1")},
		devcluster.RegionSpec{Name: "us-east", Jurisdiction: "us", Agents: agent("us-n1")})
	eu, us := cl.Regions[0], cl.Regions[1]
	mgmt := append(cl.ClientEnv(), cliconn.EnvAddr+"="+cl.GlobalAddr)
	if cl.ManagementToken() == "" || !slices.Contains(mgmt, acl.EnvToken+"="+cl.ManagementToken()) {
		t.Fatalf("the cluster's client environment lacks the management token: %q", mgmt)
	}
	if st, err := os.Stat(cl.ManagementTokenFile()); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("management token file: %v, mode %v; want 0600", err, st)
	}
	dir := t.TempDir()

	r := mustCLI(t, mgmt, "acl", "token", "self")
	if !regexp.MustCompile(`(?m)^Type:\s+management$`).MatchString(r.stdout) {
		t.Fatalf("acl token self: %s", r.stdout)
	}
	// --tls-server-name: the server's certificate must carry the name and
	// the identity it implies. The router's address dialed as a region
	// fails the handshake (exit 3, not reached); as the router, it works;
	// a region's address dialed as eu-west works, as us-east fails.
	if r := runCLI(t, mgmt, "acl", "token", "self", "--timeout", "2s", "--tls-server-name", "region.eu-west.apiary"); r.code != exitUnavailable ||
		!strings.Contains(r.stderr, "region.eu-west.apiary") {
		t.Fatalf("router dialed as region.eu-west.apiary: exit %d, want %d naming the name\n%s", r.code, exitUnavailable, r.stderr)
	}
	mustCLI(t, mgmt, "acl", "token", "self", "--tls-server-name", "router.global.apiary")
	mustCLI(t, append(slices.Clone(mgmt), cliconn.EnvTLSServerName+"=region.eu-west.apiary"), "acl", "token", "self", "--addr", eu.APIAddrs[0])
	if r := runCLI(t, mgmt, "acl", "token", "self", "--timeout", "2s", "--addr", eu.APIAddrs[0], "--tls-server-name", "region.us-east.apiary"); r.code != exitUnavailable {
		t.Fatalf("eu-west's coordinator dialed as region.us-east.apiary: exit %d, want %d\n%s", r.code, exitUnavailable, r.stderr)
	}

	// The bootstrap cannot be done again with other ids.
	wantRefused(t, withToken(mgmt, ""), []string{"already"}, "acl", "bootstrap")

	// A policy for namespace a, applied through the router in every region.
	polFile := filepath.Join(dir, "team-a.yaml")
	if err := os.WriteFile(polFile, []byte("namespaces:\n  - name: a\n    capabilities: [submit, read, cancel]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = mustCLI(t, mgmt, "acl", "policy", "apply", "--description", "team A", "team-a", polFile)
	if !strings.Contains(r.stdout, "policy team-a applied in eu-west, us-east") {
		t.Fatalf("acl policy apply: %s", r.stdout)
	}
	alice := tokenJSON(t, mgmt, "--name", "alice", "--policy", "team-a")
	if alice.GetType() != acl.TypeClient || !slices.Equal(alice.GetPolicies(), []string{"team-a"}) {
		t.Fatalf("alice's token: %v", alice)
	}
	// A --ttl below 1 ms is rounded up to 1 ms, never truncated to 0
	// (which means "never expires"): the token is made expired at once.
	short := tokenJSON(t, mgmt, "--name", "short", "--policy", "team-a", "--ttl", "1ns")
	if e := short.GetExpirationTimeMs(); e != short.GetCreateTimeMs()+1 {
		t.Fatalf("acl token create --ttl 1ns: expiration %d, create %d; want create + 1 ms", e, short.GetCreateTimeMs())
	}
	wantRefused(t, withToken(mgmt, short.GetSecretId()), []string{"not allowed", "expired at"}, "job", "list")
	for _, reg := range []*devcluster.Region{eu, us} {
		if names := tokenNames(t, mgmt, reg.APIAddrs[0]); !slices.Contains(names, "alice") {
			t.Fatalf("region %s does not hold alice's token: %v", reg.Spec.Name, names)
		}
	}
	// --secret-file: the secret alone, mode 0600; never overwritten (the
	// refusal comes before any call: no token is made).
	secretFile := filepath.Join(dir, "bob.secret")
	bob := tokenJSON(t, mgmt, "--name", "bob", "--policy", "team-a", "--secret-file", secretFile)
	if b, err := os.ReadFile(secretFile); err != nil || string(b) != bob.GetSecretId()+"\n" {
		t.Fatalf("--secret-file holds %q (%v), want bob's secret and a newline", b, err)
	}
	if st, err := os.Stat(secretFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("--secret-file mode: %v %v, want 0600", st, err)
	}
	wantRefused(t, mgmt, []string{"exists already"}, "acl", "token", "create", "--name", "carol", "--policy", "team-a", "--secret-file", secretFile)
	if names := tokenNames(t, mgmt, cl.GlobalAddr); slices.Contains(names, "carol") {
		t.Fatalf("a refused --secret-file still made the token: %v", names)
	}
	aliceEnv := withToken(mgmt, alice.GetSecretId())
	r = mustCLI(t, aliceEnv, "acl", "token", "self")
	if !strings.Contains(r.stdout, alice.GetAccessorId()) || strings.Contains(r.stdout, alice.GetSecretId()) {
		t.Fatalf("acl token self as alice (accessor, and no secret): %s", r.stdout)
	}

	// A job in namespace b (the management token), one in a (alice).
	jobFile := filepath.Join(dir, "sleep.yaml")
	if err := os.WriteFile(jobFile, []byte(fmt.Sprintf(sleepJob, "sleeper")), 0o644); err != nil {
		t.Fatal(err)
	}
	jobB := strings.TrimSpace(mustCLI(t, mgmt, "job", "run", jobFile, "--namespace", "b").stdout)
	jobA := strings.TrimSpace(mustCLI(t, aliceEnv, "job", "run", jobFile, "--namespace", "a").stdout)
	if jobA == "" || jobB == "" {
		t.Fatalf("job ids %q %q", jobA, jobB)
	}
	// A keyed submission (--request-id): the router's idempotency lookups
	// carry alice's token, its own region-list read is marked internal.
	keyed := strings.TrimSpace(mustCLI(t, aliceEnv, "job", "run", jobFile, "--namespace", "a", "--request-id", "acl-k1").stdout)
	if again := strings.TrimSpace(mustCLI(t, aliceEnv, "job", "run", jobFile, "--namespace", "a", "--request-id", "acl-k1").stdout); again != keyed || keyed == "" {
		t.Fatalf("keyed submission twice: %q then %q, want the same job", keyed, again)
	}
	mustCLI(t, aliceEnv, "job", "cancel", keyed)
	if r := mustCLI(t, aliceEnv, "job", "status", jobA); !regexp.MustCompile(`(?m)^Namespace:\s+a$`).MatchString(r.stdout) {
		t.Fatalf("job status %s: no namespace a:\n%s", jobA, r.stdout)
	}
	mustCLI(t, aliceEnv, "job", "logs", jobA)
	r = mustCLI(t, aliceEnv, "job", "list")
	if !regexp.MustCompile(`(?m)^`+jobA+`\s+a\s+sleeper\s`).MatchString(r.stdout) || strings.Contains(r.stdout, jobB) {
		t.Fatalf("job list as alice: want %s (namespace a) and not %s:\n%s%s", jobA, jobB, r.stdout, r.stderr)
	}
	if r := mustCLI(t, mgmt, "job", "list"); !strings.Contains(r.stdout, jobA) || !regexp.MustCompile(`(?m)^`+jobB+`\s+b\s`).MatchString(r.stdout) {
		t.Fatalf("job list with the management token: want both jobs:\n%s", r.stdout)
	}
	denied := []string{"not allowed", "ask an operator for a policy"}
	wantRefused(t, aliceEnv, denied, "job", "status", jobB)
	wantRefused(t, aliceEnv, denied, "job", "cancel", jobB)
	wantRefused(t, aliceEnv, denied, "job", "logs", jobB)
	wantRefused(t, aliceEnv, denied, "job", "list", "--namespace", "b")
	wantRefused(t, aliceEnv, denied, "job", "run", jobFile, "--namespace", "b")
	wantRefused(t, aliceEnv, []string{"not allowed", "only a management token may do this"}, "acl", "token", "list")
	if r := mustCLI(t, aliceEnv, "job", "cancel", jobA); !strings.Contains(r.stdout, jobA) {
		t.Fatalf("job cancel %s: %s", jobA, r.stdout)
	}
	if r := mustCLI(t, mgmt, "job", "status", jobB); !regexp.MustCompile(`(?m)^State:\s+(PENDING|RUNNING)`).MatchString(r.stdout) {
		t.Fatalf("job %s after alice's refused cancel: %s", jobB, r.stdout)
	}

	// A token no region knows, and no token: refused through the router
	// as by the regions, on every kind of call.
	unknown := acl.NewID()
	noToken := []string{"not allowed", acl.EnvToken}
	for _, env := range [][]string{withToken(mgmt, unknown), withToken(mgmt, "")} {
		wantRefused(t, env, noToken, "job", "list")
		wantRefused(t, env, noToken, "job", "status", jobA)
		wantRefused(t, env, noToken, "job", "run", jobFile)
		wantRefused(t, env, noToken, "region", "list")
		wantRefused(t, env, noToken, "node", "list")
	}
	routerConn := func(secret string) *grpc.ClientConn {
		f := cl.ClientTLS()
		rel, err := f.Load()
		if err != nil {
			t.Fatal(err)
		}
		cc, err := cliconn.DialTLS(cl.GlobalAddr, rel, "", cliconn.WithToken(secret))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	jobs := apiaryv1.NewJobServiceClient(routerConn(unknown))
	w, err := jobs.WatchJob(ctx, &apiaryv1.WatchJobRequest{JobId: jobA})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("WatchJob through the router with an unknown token: %v; want UNAUTHENTICATED", err)
	}
	if _, err := jobs.GetJobTrace(ctx, &apiaryv1.GetJobTraceRequest{JobId: jobA}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("GetJobTrace through the router with an unknown token: %v; want UNAUTHENTICATED (not even the router's spans)", err)
	}
	if _, err := apiaryv1.NewACLServiceClient(routerConn(unknown)).ListACLTokens(ctx, &apiaryv1.ListACLTokensRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("ListACLTokens through the router with an unknown token: %v; want UNAUTHENTICATED", err)
	}

	// All or nothing, a region refusing: a policy only eu-west has.
	euOnly := filepath.Join(dir, "eu-only.yaml")
	if err := os.WriteFile(euOnly, []byte("node: read\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustCLI(t, mgmt, "acl", "policy", "apply", "eu-only", euOnly, "--addr", eu.APIAddrs[0])
	r = runCLI(t, mgmt, "acl", "token", "create", "--name", "half-made", "--policy", "eu-only")
	t.Logf("token create with a policy only eu-west has: exit %d\n%s", r.code, r.stderr)
	if r.code != exitInvalid || !strings.Contains(r.stderr, `us-east: policies[0]: no policy "eu-only"`) || !strings.Contains(r.stderr, "revoked again in eu-west") {
		t.Fatalf("token create with a policy only eu-west has: exit %d, want 2 naming us-east's refusal and the revocation in eu-west\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, reg := range []*devcluster.Region{eu, us} {
		if names := tokenNames(t, mgmt, reg.APIAddrs[0]); slices.Contains(names, "half-made") {
			t.Fatalf("region %s holds the token that was not made everywhere: %v", reg.Spec.Name, names)
		}
	}

	// All or nothing, a region down.
	if err := us.Coords[0].Kill(); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, mgmt, "acl", "token", "create", "--name", "region-down", "--policy", "team-a", "--timeout", "2s")
	t.Logf("token create with us-east down: exit %d\n%s", r.code, r.stderr)
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "us-east") {
		t.Fatalf("token create with us-east down: exit %d, want 3 naming us-east\n%s%s", r.code, r.stdout, r.stderr)
	}
	if names := tokenNames(t, mgmt, eu.APIAddrs[0]); slices.Contains(names, "region-down") {
		t.Fatalf("eu-west holds the token made while us-east was down: %v", names)
	}
	if err := us.RestartCoordinator(ctx, 0); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "us-east answers again", func() error {
		r := runCLI(t, mgmt, "acl", "token", "list", "-o", "json", "--addr", us.APIAddrs[0], "--timeout", "2s")
		if r.code != 0 {
			return fmt.Errorf("exit %d: %s", r.code, r.stderr)
		}
		if strings.Contains(r.stdout, "region-down") {
			t.Fatalf("us-east holds the token made while it was down:\n%s", r.stdout)
		}
		return nil
	})
}

// TestAgentJoinToken: a region with ACLs refuses an agent without a join
// token, and one with a token it does not know, each logging one ERROR
// with the hint while it keeps retrying (the process runs on); when the
// token is made afterwards (with the secret the agent holds), the agent
// registers without a restart, the ERROR said once. An agent given a token
// made for its node in $APIARY_JOIN_TOKEN registers, and its tasks do not
// see the token.
func TestAgentJoinToken(t *testing.T) {
	cl := aclCluster(t, false, devcluster.RegionSpec{Name: "eu-west", Jurisdiction: "eu"})
	eu := cl.Regions[0]
	env := append(cl.ClientEnv(), cliconn.EnvAddr+"="+eu.Addr())
	dir := t.TempDir()
	agentArgs := func(id string, extra ...string) []string {
		f, err := cl.PKI().Cert(pki.RoleAgent, "eu-west", id)
		if err != nil {
			t.Fatal(err)
		}
		args := append([]string{"agent", "--addr", eu.Addr(), "--data-dir", filepath.Join(dir, id), "--cpu-millis", "1000",
			"--memory-mb", "1024", "--lan-addr", "off", "--label", "who=" + id}, devcluster.Args(f)...)
		return append(args, extra...)
	}
	running := func(p *proc) error {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("the agent exited (%v):\n%s", err, p.out.String())
		default:
			return nil
		}
	}
	refusedWithHint := func(p *proc, what, why string) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, what+": the refusal logged with the hint", func() error {
			if err := running(p); err != nil {
				t.Fatal(err)
			}
			out := p.out.String()
			if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "registration refused") ||
				!strings.Contains(out, why) || !strings.Contains(out, "apiary acl token create --type agent --region") {
				return fmt.Errorf("not yet:\n%s", out)
			}
			return nil
		})
		for _, line := range strings.Split(p.out.String(), "\n") {
			if strings.Contains(line, "registration refused") {
				t.Logf("%s: %s", what, line)
			}
		}
	}
	nodeReady := func(id string) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, id+" READY", func() error {
			r := runCLI(t, env, "node", "list")
			if !regexp.MustCompile(`(?m)\s` + id + `\s+READY`).MatchString(r.stdout) {
				return fmt.Errorf("exit %d:\n%s%s", r.code, r.stdout, r.stderr)
			}
			return nil
		})
	}

	noToken := startProc(t, agentArgs("eu-n7")...)
	refusedWithHint(noToken, "no join token", "the agent sent no join token")

	// A token the region does not know yet: refused, retried; then the
	// token is made with that very secret, and the agent gets in.
	secret := acl.NewID()
	file := filepath.Join(dir, "eu-n8.token")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	later := startProc(t, agentArgs("eu-n8", "--join-token-file", file)...)
	refusedWithHint(later, "unknown join token", "is not valid for this node")
	conn, err := eu.Dial() // the management token
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := apiaryv1.NewACLServiceClient(conn).CreateACLToken(ctx, &apiaryv1.CreateACLTokenRequest{Name: "eu-n8 join", Type: acl.TypeAgent,
		Region: "eu-west", NodeId: "eu-n8", AccessorId: acl.NewID(), SecretId: secret}); err != nil {
		t.Fatal(err)
	}
	nodeReady("eu-n8")
	if n := strings.Count(later.out.String(), "registration refused"); n != 1 {
		t.Errorf("eu-n8 logged %d refusals, want 1 (said once, retried quietly):\n%s", n, later.out.String())
	}
	if err := running(noToken); err != nil {
		t.Fatalf("the agent without a token: %v", err)
	}
	if r := runCLI(t, env, "node", "list"); r.code != 0 || strings.Contains(r.stdout, "eu-n7") {
		t.Fatalf("node list: exit %d; the agent without a token must not be a node:\n%s%s", r.code, r.stdout, r.stderr)
	}

	// A token made with the CLI, given in the environment.
	tok := tokenJSON(t, env, "--name", "eu-n9 join", "--type", "agent", "--region", "eu-west", "--node-id", "eu-n9")
	if tok.GetType() != acl.TypeAgent || tok.GetNodeId() != "eu-n9" {
		t.Fatalf("agent token: %v", tok)
	}
	t.Setenv(EnvJoinToken, tok.GetSecretId()) // inherited by the agent started next
	startProc(t, agentArgs("eu-n9")...)
	nodeReady("eu-n9")
	out := filepath.Join(dir, "task-env")
	job := filepath.Join(dir, "env.yaml")
	if err := os.WriteFile(job, []byte(fmt.Sprintf("name: env\ntasks:\n  - name: t\n    command: sh\n    args: [\"-c\", \"env > %s.tmp && mv %s.tmp %s\"]\n"+
		"    constraints:\n      - label: who\n        op: \"=\"\n        values: [eu-n9]\n", out, out, out)), 0o644); err != nil {
		t.Fatal(err)
	}
	mustCLI(t, env, "job", "run", job, "--wait")
	taskEnv, err := os.ReadFile(out)
	if err != nil || !strings.Contains(string(taskEnv), "APIARY_JOB_ID=") {
		t.Fatalf("task env: %v\n%s", err, taskEnv)
	}
	if strings.Contains(string(taskEnv), EnvJoinToken) || strings.Contains(string(taskEnv), tok.GetSecretId()) {
		t.Fatalf("the task inherited the join token:\n%s", taskEnv)
	}
}

// TestACLCLIInputErrorsExit2WithoutDialing: bad ACL and namespace input
// exits 2 naming the flag or argument and the rule, and nothing is dialed;
// a token is never sent in plaintext off loopback (refused before dialing).
func TestACLCLIInputErrorsExit2WithoutDialing(t *testing.T) {
	addr, dials := countingListener(t)
	dir := t.TempDir()
	notUUID := filepath.Join(dir, "secret")
	badPolicy := filepath.Join(dir, "bad.yaml")
	for f, content := range map[string]string{notUUID: "hunter2\n", badPolicy: "namespaces:\n  - name: a\n    capabilities: [delete]\n"} {
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"acl", "bootstrap", notUUID}, "must be a UUID"},
		{[]string{"acl", "bootstrap", "--accessor", "x"}, "--accessor: must be a UUID"},
		{[]string{"acl", "token", "create"}, "--name: is required"},
		{[]string{"acl", "token", "create", "--name", "n", "--type", "root"}, "--type: must be client, management or agent"},
		{[]string{"acl", "token", "create", "--name", "n", "--type", "management", "--policy", "p"}, "--policy: only for client tokens"},
		{[]string{"acl", "token", "create", "--name", "n", "--type", "agent"}, "--region: required for an agent token"},
		{[]string{"acl", "token", "create", "--name", "n", "--region", "eu-west"}, "--region and --node-id: only for agent tokens"},
		{[]string{"acl", "token", "create", "--name", "n", "--policy", "p", "--ttl", "-1h"}, "--ttl: must be >= 0"},
		{[]string{"acl", "token", "revoke", "not-an-accessor"}, "ACCESSOR: must be a UUID"},
		{[]string{"acl", "policy", "apply", "team-a", badPolicy}, `namespaces[0].capabilities[0]: "delete" is not one of submit, read, cancel`},
		{[]string{"acl", "policy", "apply", "bad name", badPolicy}, "name: must be 1-128 characters"},
		{[]string{"job", "run", "../../examples/hello.yaml", "--namespace", "Team_A"}, "--namespace: must be 1-63 characters"},
		{[]string{"job", "list", "--namespace", "-a"}, "--namespace: must be 1-63 characters"},
	} {
		r := runCLI(t, nil, append(tc.args, "--addr", addr)...)
		if r.code != exitInvalid || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("apiary %s: exit %d, want 2 saying %q\n%s", strings.Join(tc.args, " "), r.code, tc.want, r.stderr)
		}
	}
	// A token in plaintext to an address that is not loopback (TEST-NET-1,
	// nothing is there): refused before dialing, at once.
	r := runCLI(t, []string{acl.EnvToken + "=" + acl.NewID()}, "job", "list", "--addr", "192.0.2.7:7070")
	if r.code != exitInvalid || !strings.Contains(r.stderr, cliconn.TokenRefusedPrefix) || !strings.Contains(r.stderr, "192.0.2.7:7070") ||
		r.took > 5*time.Second {
		t.Errorf("job list with a token in plaintext to 192.0.2.7: exit %d in %s, want 2 at once refusing to send the token\n%s", r.code, r.took, r.stderr)
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("the CLI connected %d times for invalid input", n)
	}
}

// TestCLINamespaceSentAndShown: job run --namespace overrides the file's,
// job list sends its filter and shows a NAMESPACE column ("default" for a
// job without one), job status a Namespace line.
func TestCLINamespaceSentAndShown(t *testing.T) {
	f, addr := startFake(t)
	env := []string{cliconn.EnvAddr + "=" + addr}
	mustCLI(t, env, "job", "run", writeJob(t, "nsjob"), "--namespace", "team-a")
	mustCLI(t, env, "job", "run", writeJob(t, "plain"))
	f.mu.Lock()
	if len(f.submits) != 2 || f.submits[0].GetSpec().GetNamespace() != "team-a" || acl.OrDefault(f.submits[1].GetSpec().GetNamespace()) != acl.DefaultNamespace {
		t.Fatalf("submitted namespaces: %v", f.submits)
	}
	f.mu.Unlock()
	r := mustCLI(t, env, "job", "list")
	if !regexp.MustCompile(`(?m)^ID\s+NAMESPACE\s+NAME`).MatchString(r.stdout) || !regexp.MustCompile(`(?m)^test-nsjob\s+team-a\s+nsjob\s`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^test-plain\s+default\s+plain\s`).MatchString(r.stdout) {
		t.Fatalf("job list:\n%s", r.stdout)
	}
	if r := mustCLI(t, env, "job", "list", "--namespace", "team-a"); !strings.Contains(r.stdout, "test-nsjob") || strings.Contains(r.stdout, "test-plain") {
		t.Fatalf("job list --namespace team-a:\n%s", r.stdout)
	}
	if r := mustCLI(t, env, "job", "status", "test-nsjob"); !regexp.MustCompile(`(?m)^Namespace:\s+team-a$`).MatchString(r.stdout) {
		t.Fatalf("job status:\n%s", r.stdout)
	}
}
