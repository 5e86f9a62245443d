package aclstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/internal/testutil/etcdtest"
)

// startEtcd runs a one-member embedded etcd on loopback for the test.
func startEtcd(t *testing.T) *clientv3.Client { return etcdtest.Start(t) }

// aliveKey stands for regional's node epoch key in these tests.
func aliveKey(node string) string { return "/test/alive/" + node }

func newStore(t *testing.T, cli *clientv3.Client, run bool) *Store {
	t.Helper()
	s, err := New(Config{Client: cli, Region: "eu-west", EndNodeOps: func(n string) []clientv3.Op { return []clientv3.Op{clientv3.OpDelete(aliveKey(n))} }})
	if err != nil {
		t.Fatal(err)
	}
	if run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		testutil.Eventually(t, 10*time.Second, "acl cache loaded", func() error {
			s.mu.RLock()
			defer s.mu.RUnlock()
			if s.rev == 0 {
				return errors.New("not loaded")
			}
			return nil
		})
	}
	return s
}

func code(t *testing.T, what string, err error, want codes.Code, text string) {
	t.Helper()
	if status.Code(err) != want || !strings.Contains(status.Convert(err).Message(), text) {
		t.Errorf("%s: %v; want %s containing %q", what, err, want, text)
	}
}

func ctx10(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// allValues is every value under Prefix (to look for secrets).
func allValues(t *testing.T, cli *clientv3.Client) string {
	t.Helper()
	resp, err := cli.Get(ctx10(t), Prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, kv := range resp.Kvs {
		fmt.Fprintf(&b, "%s=%s\n", kv.Key, kv.Value)
	}
	return b.String()
}

// TestBootstrap: once per region; a second bootstrap is ALREADY_EXISTS, a
// repeat with the same ids returns the token again; of concurrent
// bootstraps exactly one wins; the secret is never stored.
func TestBootstrap(t *testing.T) {
	cli := startEtcd(t)
	s := newStore(t, cli, true)
	ctx := ctx10(t)
	acc, sec := acl.NewID(), acl.NewID()
	tok, err := s.Bootstrap(ctx, &apiaryv1.BootstrapACLRequest{AccessorId: acc, SecretId: sec})
	if err != nil || tok.GetAccessorId() != acc || tok.GetSecretId() != sec || tok.GetType() != acl.TypeManagement {
		t.Fatalf("bootstrap: %v, %v", tok, err)
	}
	a, err := s.Resolve(ctx, sec)
	if err != nil || !a.IsManagement() || a.AccessorID() != acc {
		t.Fatalf("Resolve(bootstrap secret) = %v, %v", a, err)
	}
	again, err := s.Bootstrap(ctx, &apiaryv1.BootstrapACLRequest{AccessorId: acc, SecretId: sec})
	if err != nil || again.GetAccessorId() != acc || again.GetCreateTimeMs() != tok.GetCreateTimeMs() {
		t.Errorf("repeat with the same ids: %v, %v", again, err)
	}
	_, err = s.Bootstrap(ctx, &apiaryv1.BootstrapACLRequest{})
	code(t, "second bootstrap", err, codes.AlreadyExists, "bootstrapped already")
	_, err = s.Bootstrap(ctx, &apiaryv1.BootstrapACLRequest{AccessorId: acc, SecretId: acl.NewID()})
	code(t, "same accessor, other secret", err, codes.AlreadyExists, "")
	_, err = s.Bootstrap(ctx, &apiaryv1.BootstrapACLRequest{AccessorId: acc})
	code(t, "accessor without secret", err, codes.InvalidArgument, "give both")
	_, err = s.Bootstrap(ctx, &apiaryv1.BootstrapACLRequest{AccessorId: "x", SecretId: sec})
	code(t, "accessor not a UUID", err, codes.InvalidArgument, "accessor_id: must be a UUID")
	if v := allValues(t, cli); strings.Contains(v, sec) {
		t.Errorf("the secret is stored:\n%s", v)
	}
	// Revoked, the bootstrap token is not given back by a repeat.
	if _, err := s.RevokeToken(ctx, acc); err != nil {
		t.Fatal(err)
	}
	_, err = s.Bootstrap(ctx, &apiaryv1.BootstrapACLRequest{AccessorId: acc, SecretId: sec})
	code(t, "repeat after revocation", err, codes.AlreadyExists, "revoked since")

	// Concurrent bootstraps of a fresh region: one wins.
	cli2 := startEtcd(t)
	s2 := newStore(t, cli2, false)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, exists := 0, 0
	for range 8 {
		wg.Go(func() {
			_, err := s2.Bootstrap(ctx, &apiaryv1.BootstrapACLRequest{})
			mu.Lock()
			defer mu.Unlock()
			switch status.Code(err) {
			case codes.OK:
				wins++
			case codes.AlreadyExists:
				exists++
			default:
				t.Errorf("concurrent bootstrap: %v", err)
			}
		})
	}
	wg.Wait()
	if wins != 1 || exists != 7 {
		t.Errorf("8 concurrent bootstraps: %d won, %d ALREADY_EXISTS; want 1 and 7", wins, exists)
	}
}

// TestTokensAndPolicies: client tokens get the union of their policies
// (read from the cache, and from etcd by a coordinator whose cache has not
// got them); unknown and expired tokens are refused with a message naming
// APIARY_TOKEN; repeats with the router's ids succeed; revocation takes
// effect on return; missing policies and bad fields are refused naming
// the field.
func TestTokensAndPolicies(t *testing.T) {
	cli := startEtcd(t)
	clock := time.Now()
	var clockMu sync.Mutex
	s := newStore(t, cli, true)
	s.now = func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return clock }
	cold := newStore(t, cli, false) // never loads: every Resolve is a miss
	ctx := ctx10(t)

	for _, p := range []*apiaryv1.ACLPolicy{
		{Name: "team-a", Namespaces: []*apiaryv1.ACLNamespaceRule{{Name: "a", Capabilities: []string{"submit", "read"}}}},
		{Name: "nodes", Node: "read"},
	} {
		if err := s.ApplyPolicy(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	err := s.ApplyPolicy(ctx, &apiaryv1.ACLPolicy{Name: "bad", Namespaces: []*apiaryv1.ACLNamespaceRule{{Name: "a", Capabilities: []string{"delete"}}}})
	code(t, "invalid policy", err, codes.InvalidArgument, `namespaces[0].capabilities[0]: "delete" is not one of submit, read, cancel`)

	_, err = s.CreateToken(ctx, &apiaryv1.CreateACLTokenRequest{Name: "x", Policies: []string{"team-a", "missing"}})
	code(t, "missing policy", err, codes.InvalidArgument, `policies[1]: no policy "missing"`)
	for _, tc := range []struct {
		req  *apiaryv1.CreateACLTokenRequest
		want string
	}{
		{&apiaryv1.CreateACLTokenRequest{}, "policies: a client token needs at least one policy"},
		{&apiaryv1.CreateACLTokenRequest{Type: "root"}, "type: must be one of client, management, agent"},
		{&apiaryv1.CreateACLTokenRequest{Type: "management", Policies: []string{"team-a"}}, "policies: a management token takes no policies"},
		{&apiaryv1.CreateACLTokenRequest{Type: "agent"}, "region: an agent token needs the region"},
		{&apiaryv1.CreateACLTokenRequest{Type: "agent", Region: "us-east"}, "region: an agent token for region us-east cannot be made in region eu-west"},
		{&apiaryv1.CreateACLTokenRequest{Type: "agent", Region: "eu-west", NodeId: "N_1"}, "node_id: must be an agent certificate's id"},
		{&apiaryv1.CreateACLTokenRequest{Policies: []string{"team-a"}, TtlMs: -1}, "ttl_ms: must be between 0"},
		{&apiaryv1.CreateACLTokenRequest{Policies: []string{"team-a"}, Region: "eu-west"}, "region, node_id: only agent tokens"},
		{&apiaryv1.CreateACLTokenRequest{Policies: []string{"team-a", "team-a"}}, `policies[1]: "team-a" is named twice`},
	} {
		_, err := s.CreateToken(ctx, tc.req)
		code(t, fmt.Sprint(tc.req), err, codes.InvalidArgument, tc.want)
	}

	acc, sec := acl.NewID(), acl.NewID()
	req := &apiaryv1.CreateACLTokenRequest{Name: "team a", Policies: []string{"team-a", "nodes"}, AccessorId: acc, SecretId: sec, TtlMs: 60_000}
	tok, err := s.CreateToken(ctx, req)
	if err != nil || tok.GetSecretId() != sec || tok.GetType() != acl.TypeClient || tok.GetExpirationTimeMs() != clock.UnixMilli()+60_000 {
		t.Fatalf("create: %v, %v", tok, err)
	}
	if again, err := s.CreateToken(ctx, req); err != nil || again.GetCreateTimeMs() != tok.GetCreateTimeMs() {
		t.Errorf("repeat of a create with the same ids: %v, %v", again, err)
	}
	other := proto.Clone(req).(*apiaryv1.CreateACLTokenRequest)
	other.SecretId = acl.NewID()
	_, err = s.CreateToken(ctx, other)
	code(t, "same accessor, other secret", err, codes.AlreadyExists, "accessor_id: "+acc+" is another token's")
	other = proto.Clone(req).(*apiaryv1.CreateACLTokenRequest)
	other.AccessorId = acl.NewID()
	_, err = s.CreateToken(ctx, other)
	code(t, "other accessor, same secret", err, codes.AlreadyExists, "secret_id: already another token's secret")

	for name, st := range map[string]*Store{"cached": s, "cold (etcd read)": cold} {
		a, err := st.Resolve(ctx, sec)
		if err != nil {
			t.Fatalf("%s Resolve: %v", name, err)
		}
		if !a.AllowNamespace("a", acl.CapRead) || !a.AllowNamespace("a", acl.CapSubmit) || a.AllowNamespace("a", acl.CapCancel) ||
			a.AllowNamespace("b", acl.CapRead) || !a.AllowNode(false) || a.AllowNode(true) || a.IsManagement() || a.AccessorID() != acc {
			t.Errorf("%s: wrong grants for %v", name, a.Token())
		}
	}
	for name, st := range map[string]*Store{"cached": s, "cold": cold} {
		_, err := st.Resolve(ctx, acl.NewID())
		code(t, name+" unknown token", err, codes.Unauthenticated, "set APIARY_TOKEN")
		var d *Denial
		if !errors.As(err, &d) || d.Reason != acl.ReasonUnknownToken {
			t.Errorf("%s unknown token: reason %v", name, err)
		}
		_, err = st.Resolve(ctx, "")
		if !errors.As(err, &d) || d.Reason != acl.ReasonNoToken || d.Code != codes.Unauthenticated {
			t.Errorf("%s no token: %v", name, err)
		}
	}
	// The Accessor ID presented as the secret: the refusal says which ID
	// to use (the cached store knows the accessor).
	_, err = s.Resolve(ctx, acc)
	code(t, "accessor id as the secret", err, codes.Unauthenticated, acc+" is the Accessor ID of an ACL token, not its secret")
	// A policy change reaches the cached grants.
	if err := s.ApplyPolicy(ctx, &apiaryv1.ACLPolicy{Name: "nodes", Node: "write"}); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Resolve(ctx, sec); err != nil || !a.AllowNode(true) {
		t.Errorf("after the policy grew: %v, node write %v", err, a.AllowNode(true))
	}
	// Expiry.
	clockMu.Lock()
	clock = clock.Add(61 * time.Second)
	clockMu.Unlock()
	_, err = s.Resolve(ctx, sec)
	code(t, "expired", err, codes.Unauthenticated, "ACL token "+acc+" expired at")
	var d *Denial
	if !errors.As(err, &d) || d.Reason != acl.ReasonExpiredToken || d.Accessor != acc {
		t.Errorf("expired: %v", err)
	}
	// Listing shows no secret; nothing stores one.
	ts, err := s.ListTokens(ctx)
	if err != nil || len(ts) != 1 || ts[0].GetSecretId() != "" || ts[0].GetAccessorId() != acc {
		t.Errorf("ListTokens: %v, %v", ts, err)
	}
	if v := allValues(t, cli); strings.Contains(v, sec) {
		t.Errorf("the secret is stored:\n%s", v)
	}
	// Revocation: refused at once here (the answer waited for the cache).
	clockMu.Lock()
	clock = time.Now()
	clockMu.Unlock()
	t2, err := s.CreateToken(ctx, &apiaryv1.CreateACLTokenRequest{Policies: []string{"team-a"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ctx, t2.GetSecretId()); err != nil {
		t.Fatal(err)
	}
	if node, err := s.RevokeToken(ctx, t2.GetAccessorId()); err != nil || node != "" {
		t.Fatalf("revoke: %q, %v", node, err)
	}
	_, err = s.Resolve(ctx, t2.GetSecretId())
	code(t, "revoked token", err, codes.Unauthenticated, "not found")
	_, err = s.RevokeToken(ctx, t2.GetAccessorId())
	code(t, "revoke twice", err, codes.NotFound, "no token")
	// Policies: list and delete.
	ps, err := s.ListPolicies(ctx)
	if err != nil || len(ps) != 2 || ps[0].GetName() != "nodes" || ps[1].GetName() != "team-a" {
		t.Errorf("ListPolicies: %v, %v", ps, err)
	}
	if err := s.DeletePolicy(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	code(t, "delete twice", s.DeletePolicy(ctx, "team-a"), codes.NotFound, `no policy "team-a"`)
}

// TestCompactedWatchReloads: a watch from a compacted revision reports it
// (Run then reloads), and the reload holds what was written meanwhile.
func TestCompactedWatchReloads(t *testing.T) {
	cli := startEtcd(t)
	s := newStore(t, cli, false)
	ctx := ctx10(t)
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	from := s.rev + 1
	tok, err := s.CreateToken(ctx, &apiaryv1.CreateACLTokenRequest{Type: acl.TypeManagement})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Put(ctx, "/test/bump", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if !s.watch(ctx, from) {
		t.Fatal("a watch from a compacted revision did not report it")
	}
	if s.cached(acl.HashSecret(tok.GetSecretId())) != nil {
		t.Fatal("cache holds a token it never loaded")
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	s.mu.Lock()
	s.rev = from - 1 // as if Run had loaded before the writes
	s.mu.Unlock()
	go func() { s.Run(rctx); close(done) }()
	testutil.Eventually(t, 10*time.Second, "cache reloaded", func() error {
		if s.cached(acl.HashSecret(tok.GetSecretId())) == nil {
			return errors.New("token not cached")
		}
		return nil
	})
	cancel()
	<-done
}

// register stands for regional's RegisterNode: CheckJoin, then one Txn
// creating the node's epoch (its alive key) with the join's compares and
// ops, retried while the compares fail.
func register(ctx context.Context, s *Store, secret, node string) error {
	for range 20 {
		j, err := s.CheckJoin(ctx, secret, node)
		if err != nil {
			return err
		}
		resp, err := s.cfg.Client.Txn(ctx).If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(aliveKey(node)), "=", 0)}, j.Cmps...)...).
			Then(append([]clientv3.Op{clientv3.OpPut(aliveKey(node), "x")}, j.Ops...)...).Commit()
		if err != nil {
			return err
		}
		if resp.Succeeded {
			return nil
		}
		if _, err := s.cfg.Client.Delete(ctx, aliveKey(node)); err != nil { // end the earlier epoch, as RegisterNode does
			return err
		}
	}
	return errors.New("register: kept conflicting")
}

func alive(t *testing.T, cli *clientv3.Client, node string) bool {
	t.Helper()
	resp, err := cli.Get(ctx10(t), aliveKey(node))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Kvs) == 1
}

// TestJoinTokens: an agent token binds to the node of its first
// registration; another node cannot use it, the node cannot use another
// token, client tokens and other regions' tokens are refused; revoking it
// ends the node's epoch, and the node cannot register with it again.
func TestJoinTokens(t *testing.T) {
	cli := startEtcd(t)
	s := newStore(t, cli, true)
	ctx := ctx10(t)
	if err := s.ApplyPolicy(ctx, &apiaryv1.ACLPolicy{Name: "p", Node: "read"}); err != nil {
		t.Fatal(err)
	}
	mk := func(req *apiaryv1.CreateACLTokenRequest) *apiaryv1.ACLToken {
		t.Helper()
		tok, err := s.CreateToken(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ja := mk(&apiaryv1.CreateACLTokenRequest{Type: acl.TypeAgent, Region: "eu-west"})
	jb := mk(&apiaryv1.CreateACLTokenRequest{Type: acl.TypeAgent, Region: "eu-west"})
	jc := mk(&apiaryv1.CreateACLTokenRequest{Type: acl.TypeAgent, Region: "eu-west", NodeId: "n3"})
	client := mk(&apiaryv1.CreateACLTokenRequest{Policies: []string{"p"}})

	code(t, "no join token", register(ctx, s, "", "n1"), codes.Unauthenticated, "join_token: required")
	code(t, "unknown join token", register(ctx, s, acl.NewID(), "n1"), codes.Unauthenticated, "join_token: no such token")
	code(t, "client token", register(ctx, s, client.GetSecretId(), "n1"), codes.PermissionDenied, "is a client token, not an agent token")
	if err := register(ctx, s, ja.GetSecretId(), "n1"); err != nil {
		t.Fatalf("first registration: %v", err)
	}
	ts, _ := s.ListTokens(ctx)
	for _, tk := range ts {
		if tk.GetAccessorId() == ja.GetAccessorId() && tk.GetNodeId() != "n1" {
			t.Errorf("token A is bound to %q after n1 registered with it", tk.GetNodeId())
		}
	}
	if err := register(ctx, s, ja.GetSecretId(), "n1"); err != nil {
		t.Errorf("n1 registering again with its token: %v", err)
	}
	code(t, "another node with A", register(ctx, s, ja.GetSecretId(), "n2"), codes.PermissionDenied, "is bound to node n1; node n2 needs a token of its own")
	code(t, "n1 with B", register(ctx, s, jb.GetSecretId(), "n1"), codes.PermissionDenied, "node n1 is bound to another join token ("+ja.GetAccessorId()+")")
	code(t, "n4 with C (made for n3)", register(ctx, s, jc.GetSecretId(), "n4"), codes.PermissionDenied, "bound to node n3")
	if err := register(ctx, s, jc.GetSecretId(), "n3"); err != nil {
		t.Errorf("n3 with the token made for it: %v", err)
	}
	_, err := s.CreateToken(ctx, &apiaryv1.CreateACLTokenRequest{Type: acl.TypeAgent, Region: "eu-west", NodeId: "n3"})
	code(t, "a second token for n3", err, codes.AlreadyExists, "node_id: node n3 is bound to join token "+jc.GetAccessorId())
	if a, err := s.Resolve(ctx, ja.GetSecretId()); err != nil || a.AllowNode(false) || a.AllowNamespace("default", acl.CapRead) {
		t.Errorf("an agent token grants something on the API: %v", err)
	}

	node, err := s.RevokeToken(ctx, ja.GetAccessorId())
	if err != nil || node != "n1" {
		t.Fatalf("revoke A: %q, %v", node, err)
	}
	if alive(t, cli, "n1") {
		t.Error("revoking n1's token left its epoch alive")
	}
	code(t, "n1 with revoked A", register(ctx, s, ja.GetSecretId(), "n1"), codes.Unauthenticated, "join_token: no such token")
	if err := register(ctx, s, jb.GetSecretId(), "n1"); err != nil {
		t.Errorf("n1 with a new token B after A was revoked: %v", err)
	}
	if !alive(t, cli, "n1") {
		t.Error("n1 not alive after registering with B")
	}
}

// TestRevokeRacesRegistration: a revocation of a join token racing the
// registration of its node never leaves the node a live epoch without a
// token: after both, the node's epoch key is gone (the registration was
// refused, or the revocation ended the epoch it made), for a token bound
// at this registration and for one bound already.
func TestRevokeRacesRegistration(t *testing.T) {
	cli := startEtcd(t)
	s := newStore(t, cli, true)
	ctx := ctx10(t)
	registered := 0
	for i := range 40 {
		node := fmt.Sprintf("n%d", i)
		tok, err := s.CreateToken(ctx, &apiaryv1.CreateACLTokenRequest{Type: acl.TypeAgent, Region: "eu-west"})
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 { // bound before the race
			if err := register(ctx, s, tok.GetSecretId(), node); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		var regErr, revErr error
		wg.Go(func() { regErr = register(ctx, s, tok.GetSecretId(), node) })
		wg.Go(func() { _, revErr = s.RevokeToken(ctx, tok.GetAccessorId()) })
		wg.Wait()
		if revErr != nil {
			t.Fatalf("%s: revoke: %v", node, revErr)
		}
		if regErr == nil {
			registered++
		} else if status.Code(regErr) != codes.Unauthenticated {
			t.Fatalf("%s: registration failed otherwise: %v", node, regErr)
		}
		if alive(t, cli, node) {
			t.Fatalf("%s: a live epoch after its token was revoked (registration err %v)", node, regErr)
		}
	}
	t.Logf("40 races: the registration committed first %d times", registered)
}

// TestServer: the ACLService needs a management token for all but
// BootstrapACL and GetACLSelf; Off refuses everything naming --acl.
func TestServer(t *testing.T) {
	cli := startEtcd(t)
	s := newStore(t, cli, true)
	sv := NewServer(s)
	ctx := ctx10(t)
	boot, err := sv.BootstrapACL(ctx, &apiaryv1.BootstrapACLRequest{})
	if err != nil {
		t.Fatal(err)
	}
	mgmt, err := s.Resolve(ctx, boot.GetToken().GetSecretId())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ApplyPolicy(ctx, &apiaryv1.ACLPolicy{Name: "p", Node: "write", Operator: true}); err != nil {
		t.Fatal(err)
	}
	ct, err := s.CreateToken(ctx, &apiaryv1.CreateACLTokenRequest{Policies: []string{"p"}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := s.Resolve(ctx, ct.GetSecretId())
	if err != nil {
		t.Fatal(err)
	}
	asMgmt, asClient := acl.NewContext(ctx, mgmt), acl.NewContext(ctx, client)
	if _, err := sv.ListACLTokens(asMgmt, &apiaryv1.ListACLTokensRequest{}); err != nil {
		t.Errorf("ListACLTokens as management: %v", err)
	}
	for name, call := range map[string]func(context.Context) error{
		"CreateACLToken": func(c context.Context) error {
			_, err := sv.CreateACLToken(c, &apiaryv1.CreateACLTokenRequest{Type: acl.TypeManagement})
			return err
		},
		"ListACLTokens": func(c context.Context) error {
			_, err := sv.ListACLTokens(c, &apiaryv1.ListACLTokensRequest{})
			return err
		},
		"RevokeACLToken": func(c context.Context) error {
			_, err := sv.RevokeACLToken(c, &apiaryv1.RevokeACLTokenRequest{AccessorId: boot.GetToken().GetAccessorId()})
			return err
		},
		"ApplyACLPolicy": func(c context.Context) error {
			_, err := sv.ApplyACLPolicy(c, &apiaryv1.ApplyACLPolicyRequest{Policy: &apiaryv1.ACLPolicy{Name: "q"}})
			return err
		},
		"ListACLPolicies": func(c context.Context) error {
			_, err := sv.ListACLPolicies(c, &apiaryv1.ListACLPoliciesRequest{})
			return err
		},
		"DeleteACLPolicy": func(c context.Context) error {
			_, err := sv.DeleteACLPolicy(c, &apiaryv1.DeleteACLPolicyRequest{Name: "p"})
			return err
		},
	} {
		code(t, name+" as a client token", call(asClient), codes.PermissionDenied, "needs a management token")
		code(t, name+" without a token", call(ctx), codes.PermissionDenied, "needs a management token")
	}
	self, err := sv.GetACLSelf(asClient, &apiaryv1.GetACLSelfRequest{})
	if err != nil || self.GetToken().GetAccessorId() != ct.GetAccessorId() || self.GetToken().GetSecretId() != "" {
		t.Errorf("GetACLSelf: %v, %v", self, err)
	}
	_, err = sv.GetACLSelf(ctx, &apiaryv1.GetACLSelfRequest{})
	code(t, "GetACLSelf without a token", err, codes.Unauthenticated, "APIARY_TOKEN")
	_, err = Off{Region: "eu-west"}.ListACLTokens(ctx, &apiaryv1.ListACLTokensRequest{})
	code(t, "Off", err, codes.FailedPrecondition, "ACLs are off in region eu-west (start its coordinators with --acl)")
}
