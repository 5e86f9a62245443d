package regional_test

// Client-only coordinators (EtcdConfig.Endpoints, `apiary region
// --etcd-endpoints`): a coordinator without an embedded etcd member joins a
// region of members, takes its rendezvous share of the shards, and hands
// them back when it stops, with no shard owned twice at any revision.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/pki"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/regional"
	"apiary.dev/apiary/shards"
	"apiary.dev/apiary/shards/shardstest"
)

// memberRegion is the configs of a region of n coordinators with embedded
// members (ids c1..cn, one --initial-cluster) and S shards, each with
// coordConfig's defaults (lifecycle_test.go) and its own log buffer.
func memberRegion(t *testing.T, n, S int) ([]regional.Config, []*testutil.LogBuffer) {
	t.Helper()
	var cfgs []regional.Config
	var logs []*testutil.LogBuffer
	var initial []string
	for i := range n {
		cfg := coordConfig(t)
		cfg.ID = fmt.Sprintf("c%d", i+1)
		cfg.ShardCount = S
		cfg.MetricsAddr = ""
		buf := &testutil.LogBuffer{}
		cfg.Logger = slog.New(slog.NewTextHandler(buf, nil))
		initial = append(initial, cfg.ID+"="+cfg.Etcd.PeerURL)
		cfgs, logs = append(cfgs, cfg), append(logs, buf)
	}
	for i := range cfgs {
		cfgs[i].Etcd.InitialCluster = strings.Join(initial, ",")
	}
	return cfgs, logs
}

// clientOnly is the config of a coordinator id without a member, a client
// of the given members' client URLs (and of their shard count).
func clientOnly(t *testing.T, id string, members []regional.Config) (regional.Config, *testutil.LogBuffer) {
	cfg := coordConfig(t)
	cfg.ID = id
	if len(members) > 0 {
		cfg.ShardCount = members[0].ShardCount
	}
	cfg.MetricsAddr = ""
	buf := &testutil.LogBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(buf, nil))
	cfg.Etcd = regional.EtcdConfig{DataDir: filepath.Join(t.TempDir(), id)}
	for _, m := range members {
		cfg.Etcd.Endpoints = append(cfg.Etcd.Endpoints, m.Etcd.ClientURL)
	}
	return cfg, buf
}

// startCoords starts the coordinators at once (members need a quorum to
// start), each stopped at test end; a failed test gets each one's log tail.
func startCoords(t *testing.T, cfgs []regional.Config, logs []*testutil.LogBuffer) []*regional.Coordinator {
	t.Helper()
	cs := make([]*regional.Coordinator, len(cfgs))
	errs := make([]error, len(cfgs))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		c, err := regional.New(cfg)
		if err != nil {
			t.Fatalf("%s: %v", cfg.ID, err)
		}
		cs[i] = c
		t.Cleanup(func() {
			c.Stop()
			if t.Failed() {
				t.Logf("--- %s log tail ---\n%s", cfg.ID, logs[i].Tail(3000))
			}
		})
		wg.Go(func() { errs[i] = c.Start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return cs
}

// ownsDesired is nil once every coordinator of cs owns exactly its shards
// of Desired(their ids) and etcd's owner keys (as the checker saw them)
// say the same.
func ownsDesired(cs []*regional.Coordinator, ids []string, S int, chk *shardstest.Checker) func() error {
	return func() error {
		want := shards.Desired(ids, S)
		byOwner := chk.Owners()
		for i, c := range cs {
			owned := c.OwnedShards()
			n := 0
			for s, w := range want {
				if w != ids[i] {
					continue
				}
				n++
				if _, ok := owned[s]; !ok {
					return fmt.Errorf("%s does not own shard %d yet (owns %d)", ids[i], s, len(owned))
				}
				if o := byOwner[s]; o.Member != ids[i] || o.Epoch != owned[s] {
					return fmt.Errorf("shard %d: owner key %+v, %s reports epoch %d", s, o, ids[i], owned[s])
				}
			}
			if n != len(owned) {
				return fmt.Errorf("%s owns %d shards, Desired gives it %d", ids[i], len(owned), n)
			}
		}
		return nil
	}
}

// counts is each coordinator's OwnedShards count, by id.
func counts(cs []*regional.Coordinator, ids []string) map[string]int {
	out := map[string]int{}
	for i, c := range cs {
		out[ids[i]] = len(c.OwnedShards())
	}
	return out
}

// checkShare fails unless each id owns S/n +-20%.
func checkShare(t *testing.T, got map[string]int, S int) {
	t.Helper()
	share := float64(S) / float64(len(got))
	for id, n := range got {
		if d := float64(n) - share; d > 0.2*share || d < -0.2*share {
			t.Errorf("%s owns %d of %d shards, want %.1f +-20%%", id, n, S, share)
		}
	}
}

// TestClientOnlyCoordinatorTakesItsShare: three coordinators with embedded
// members own S/3 +-20% each (S = 256) within 10 s; a fourth started with
// Etcd.Endpoints (no member) takes its rendezvous share, about S/4, from
// the three; stopped gracefully, it hands its shards back to the three
// within 5 s. Throughout, a watch of the owner keys from revision 1 checks
// that no shard has two owners at any revision.
func TestClientOnlyCoordinatorTakesItsShare(t *testing.T) {
	const S = shards.DefaultCount
	cfgs, logs := memberRegion(t, 3, S)
	began := time.Now()
	members := startCoords(t, cfgs, logs)
	started := time.Now()
	three := []string{"c1", "c2", "c3"}

	var eps []string
	for _, cfg := range cfgs {
		eps = append(eps, cfg.Etcd.ClientURL)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	chk := shardstest.WatchNoDoubleOwner(t, cli, shards.Layout{Prefix: shards.DefaultPrefix, Count: S}, shardstest.FromRevision(1))

	testutil.Eventually(t, 10*time.Second, "three members own their Desired shards", ownsDesired(members, three, S, chk))
	c3 := counts(members, three)
	checkShare(t, c3, S)
	t.Logf("3 members: %v, Desired %s after Start returned (%s after start)", c3,
		time.Since(started).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))

	cfg4, log4 := clientOnly(t, "c4", cfgs)
	joined := time.Now()
	c4 := startCoords(t, []regional.Config{cfg4}, []*testutil.LogBuffer{log4})[0]
	if c4.Etcd() != nil {
		t.Error("a client-only coordinator has an embedded member")
	}
	if _, err := os.Stat(filepath.Join(cfg4.Etcd.DataDir, "member")); err == nil {
		t.Error("a client-only coordinator wrote etcd data in its data dir")
	}
	if fi, err := os.Stat(cfg4.Etcd.DataDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir of the client-only coordinator: %v %v, want a 0700 directory", fi, err)
	}
	four := []string{"c1", "c2", "c3", "c4"}
	all := append(slices.Clone(members), c4)
	testutil.Eventually(t, 15*time.Second, "c4 owns its Desired share", ownsDesired(all, four, S, chk))
	tookShare := time.Since(joined)
	c4s := counts(all, four)
	checkShare(t, c4s, S)
	for _, id := range three {
		if c4s[id] >= c3[id] {
			t.Errorf("%s owns %d shards with c4, %d without: it should have handed some to c4", id, c4s[id], c3[id])
		}
	}
	t.Logf("with client-only c4: %v, Desired %s after c4's Start began (settle %s)", c4s,
		tookShare.Round(time.Millisecond), shards.DefaultSettle)

	chk.CaughtUp(t, cli)
	// c4's GetRegionInfo names the etcd leader it has no member of (it
	// asks the cluster), as the members' answers do.
	leaders := map[string]string{}
	for _, co := range []*regional.Coordinator{members[0], c4} {
		conn, err := grpc.NewClient(co.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "GetRegionInfo names the etcd leader", func() error {
			info, err := apiaryv1.NewAdminServiceClient(conn).GetRegionInfo(context.Background(), &apiaryv1.GetRegionInfoRequest{})
			if err != nil {
				return err
			}
			if info.GetEtcdLeader() == "" {
				return errors.New("no etcd leader named")
			}
			// The state's size from a member's Status; the quota is the
			// member's own setting, unknown (0) to a client-only one.
			wantQuota := regional.DefaultQuotaBytes
			if co == c4 {
				wantQuota = 0
			}
			if info.GetStateSizeBytes() <= 0 || info.GetStateInUseBytes() <= 0 || info.GetStateInUseBytes() > info.GetStateSizeBytes() ||
				info.GetStateQuotaBytes() != wantQuota {
				return fmt.Errorf("state %d (%d in use) of %d, want a size and quota %d", info.GetStateSizeBytes(),
					info.GetStateInUseBytes(), info.GetStateQuotaBytes(), wantQuota)
			}
			leaders[co.Addr()] = info.GetEtcdLeader()
			return nil
		})
		// A snapshot through each: the member's own, or (c4) the first
		// endpoint's; etcd's format, whole.
		st, err := apiaryv1.NewAdminServiceClient(conn).SaveSnapshot(context.Background(), &apiaryv1.SaveSnapshotRequest{})
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "snap.db")
		var data []byte
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("SaveSnapshot through %s: %v", co.Addr(), err)
			}
			if len(m.GetData()) > regional.SnapshotChunkBytes {
				t.Fatalf("a chunk of %d bytes", len(m.GetData()))
			}
			data = append(data, m.GetData()...)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if info, err := regional.CheckSnapshot(path); err != nil || info.Revision <= 0 {
			t.Errorf("snapshot through %s: %+v, %v", co.Addr(), info, err)
		}
		conn.Close()
	}
	if leaders[c4.Addr()] != leaders[members[0].Addr()] {
		t.Errorf("etcd leader per c4: %q, per c1: %q", leaders[c4.Addr()], leaders[members[0].Addr()])
	}

	owned4 := maps.Clone(c4.OwnedShards())
	stopped := time.Now()
	c4.Stop()
	if err := c4.Err(); err != nil {
		t.Errorf("c4: a part failed: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, "the three own every shard again", ownsDesired(members, three, S, chk))
	t.Logf("c4 stopped gracefully: the three own %v, Desired %s after Stop began", counts(members, three),
		time.Since(stopped).Round(time.Millisecond))

	// Each of c4's shards: one delete (its lease revoked) and one claim by
	// the next member in rendezvous order.
	chk.CaughtUp(t, cli)
	deletes, creates := map[int]int{}, map[int]string{}
	for _, ev := range chk.EventsSince(stopped) {
		if ev.Create {
			creates[ev.Shard] = ev.Member
		} else if ev.Member == "c4" {
			deletes[ev.Shard]++
		}
	}
	for s := range owned4 {
		if deletes[s] != 1 {
			t.Errorf("shard %d of c4: %d deletes after its stop, want 1", s, deletes[s])
		}
		if next := shards.Rank(four, s, S)[1]; creates[s] != next {
			t.Errorf("shard %d of c4 went to %q, next in rendezvous order is %s", s, creates[s], next)
		}
	}
	if len(creates) != len(owned4) {
		t.Errorf("%d shards claimed after c4 stopped, c4 owned %d", len(creates), len(owned4))
	}
	if err := chk.Stop(); err != nil {
		t.Error(err)
	}
	for _, c := range members {
		if err := c.Err(); err != nil {
			t.Errorf("a part failed: %v", err)
		}
	}
}

// TestClientOnlyRefusesMemberDataDir: a client-only coordinator whose data
// dir holds an etcd member's data (member/) does not start, and says why;
// one without Endpoints' members to reach fails its start naming them and
// what it found there.
func TestClientOnlyRefusesMemberDataDir(t *testing.T) {
	cfg, _ := clientOnly(t, "c9", nil)
	cfg.Etcd.Endpoints = []string{"http://" + testutil.FreeAddr(t)} // nobody listens
	if err := os.MkdirAll(filepath.Join(cfg.Etcd.DataDir, "member", "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	c, err := regional.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = c.Start(ctx)
	if err == nil {
		c.Stop()
		t.Fatal("started with a member's data dir")
	}
	if !strings.Contains(err.Error(), "start etcd: --data-dir "+cfg.Etcd.DataDir+" holds an etcd member's data") {
		t.Errorf("Start: %v, want the etcd part and the data dir named", err)
	}

	cfg.Etcd.DataDir = filepath.Join(t.TempDir(), "fresh")
	if c, err = regional.New(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = c.Start(ctx)
	if err == nil {
		c.Stop()
		t.Fatal("started with no etcd to reach")
	}
	t.Logf("Start with nothing at --etcd-endpoints: %v", err)
	if want := "--etcd-endpoints " + cfg.Etcd.Endpoints[0]; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "cannot connect") {
		t.Errorf("Start: %v, want %q and what the probe found (cannot connect)", err, want)
	}
}

// TestClientOnlyConfigRefusals: the member's settings, schemes that do not
// match TLS, and endpoints that are not URLs are refused by regional.New
// and by `apiary region` (exit 2), naming the flags.
func TestClientOnlyConfigRefusals(t *testing.T) {
	base, _ := clientOnly(t, "c9", nil)
	base.Etcd.Endpoints = []string{"http://127.0.0.1:2379"}
	for _, tc := range []struct {
		name string
		edit func(*regional.EtcdConfig)
		want []string
	}{
		{"member flags", func(e *regional.EtcdConfig) {
			e.ClientURL, e.PeerURL, e.InitialCluster = "http://127.0.0.1:1", "http://127.0.0.1:2", "a=http://127.0.0.1:2"
		}, []string{"--etcd-client-url, --etcd-peer-url, --initial-cluster: not with --etcd-endpoints"}},
		{"existing cluster", func(e *regional.EtcdConfig) { e.ClusterState = "existing" }, []string{"--initial-cluster-state: not with --etcd-endpoints"}},
		{"https without TLS", func(e *regional.EtcdConfig) { e.Endpoints = []string{"http://127.0.0.1:1", "https://127.0.0.1:2"} },
			[]string{"--etcd-endpoints", `"https://127.0.0.1:2" must be a http:// URL`, "--insecure-dev"}},
		{"empty", func(e *regional.EtcdConfig) { e.Endpoints = []string{"http://127.0.0.1:1", ""} }, []string{"--etcd-endpoints: an empty URL"}},
		{"no scheme", func(e *regional.EtcdConfig) { e.Endpoints = []string{"127.0.0.1:2379"} }, []string{"--etcd-endpoints", "scheme://host:port"}},
	} {
		cfg := base
		cfg.Etcd.Endpoints = slices.Clone(base.Etcd.Endpoints)
		tc.edit(&cfg.Etcd)
		_, err := regional.New(cfg)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: New: %v, want it to say %q", tc.name, err, w)
			}
		}
	}

	bin := testutil.Binary(t)
	dir := t.TempDir()
	p, err := devcluster.NewPKI(filepath.Join(dir, "tls"))
	if err != nil {
		t.Fatal(err)
	}
	files, err := p.Cert(pki.RoleRegion, "eu-west", "c9")
	if err != nil {
		t.Fatal(err)
	}
	tlsArgs := devcluster.Args(files)
	common := []string{"region", "--id", "c9", "--region", "eu-west", "--data-dir", filepath.Join(dir, "c9"), "--listen", testutil.FreeAddr(t)}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"member flags", []string{"--insecure-dev", "--etcd-endpoints", "http://127.0.0.1:2379", "--initial-cluster", "a=http://127.0.0.1:2380",
			"--etcd-peer-url", "http://127.0.0.1:2380", "--etcd-election-ms", "1000"},
			[]string{"--etcd-peer-url, --initial-cluster, --etcd-election-ms: not with --etcd-endpoints"}},
		{"http with TLS", append([]string{"--etcd-endpoints", "http://127.0.0.1:2379,https://127.0.0.1:2381"}, tlsArgs...),
			[]string{`--etcd-endpoints: "http://127.0.0.1:2379" must be a https:// URL: with TLS`}},
		{"https without TLS", []string{"--insecure-dev", "--etcd-endpoints", "https://127.0.0.1:2379"},
			[]string{`--etcd-endpoints: "https://127.0.0.1:2379" must be a http:// URL`}},
	} {
		cmd := exec.Command(bin, append(slices.Clone(common), tc.args...)...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%s: apiary %s: %v, want exit 2\n%s", tc.name, strings.Join(tc.args, " "), err, out)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s: output does not say %q:\n%s", tc.name, w, out)
			}
		}
	}
}

// TestClientOnlyCoordinatorProcessTLS: real processes with mutual TLS. A
// 3-member region (devcluster) and a fourth `apiary region --etcd-endpoints
// https://...` with its own region certificate: it takes its Desired share
// of the shards, serves the API, runs the jobs of its shards on the
// region's agent, and on SIGTERM exits 0 and hands its shards back.
func TestClientOnlyCoordinatorProcessTLS(t *testing.T) {
	const S = 64
	bin := testutil.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	cl := startCluster(t, ctx, devcluster.Options{Binary: bin, Dir: dir, TLS: true, Regions: []devcluster.RegionSpec{{
		Name: "eu-west", Jurisdiction: "eu", Coordinators: 3, NoLAN: true,
		ExtraArgs: []string{"--shards", fmt.Sprint(S)}, Agents: []devcluster.AgentSpec{{ID: "n1"}}}}})
	r := cl.Regions[0]
	cli, err := cl.EtcdClient(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	chk := shardstest.WatchNoDoubleOwner(t, cli, shards.Layout{Prefix: shards.DefaultPrefix, Count: S})
	three := []string{"eu-west-c1", "eu-west-c2", "eu-west-c3"}
	testutil.Eventually(t, 10*time.Second, "three members own their Desired shards", countsAre(chk, three, S))

	id := "eu-west-c4"
	files, err := cl.PKI().Cert(pki.RoleRegion, "eu-west", id)
	if err != nil {
		t.Fatal(err)
	}
	api, ready, logPath := testutil.FreeAddr(t), filepath.Join(dir, id+".ready"), filepath.Join(dir, id+".log")
	args := append([]string{"region", "--id", id, "--region", "eu-west", "--jurisdiction", "eu", "--shards", fmt.Sprint(S),
		"--data-dir", filepath.Join(dir, id), "--listen", api, "--ready-file", ready,
		"--etcd-endpoints", strings.Join(r.EtcdEndpoints, ",")}, devcluster.Args(files)...)
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	proc := exec.Command(bin, args...)
	proc.Stdout, proc.Stderr = logf, logf
	proc.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	joined := time.Now()
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- proc.Wait() }()
	t.Cleanup(func() {
		_ = proc.Process.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- %s log tail ---\n%s", id, b[max(0, len(b)-4000):])
		}
	})
	testutil.Eventually(t, 30*time.Second, id+" ready", func() error {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("%s exited: %v", id, err)
		default:
		}
		_, err := os.Stat(ready)
		return err
	})
	four := append(slices.Clone(three), id)
	testutil.Eventually(t, 15*time.Second, id+" owns its Desired share", countsAre(chk, four, S))
	t.Logf("with client-only %s over TLS: %v, Desired %s after its start", id, chk.Counts(), time.Since(joined).Round(time.Millisecond))

	// Its API serves; jobs submitted through it run, some in its shards.
	conn, err := cl.Dial(api)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := clients{conn, apiaryv1.NewJobServiceClient(conn), apiaryv1.NewAgentServiceClient(conn), apiaryv1.NewAdminServiceClient(conn)}
	var ids []string
	inC4 := 0
	for i := 0; i < 60 && inC4 < 1; i++ { // c4 owns about 1/4 of the shards
		jid := submit(t, c, spec(t, fmt.Sprintf("name: j%d\ntasks:\n  - name: t\n    command: \"true\"\n", i)))
		ids = append(ids, jid)
		if o := chk.Owners()[shards.Of(jid, S)]; o.Member == id {
			inC4++
		}
	}
	if inC4 < 1 {
		t.Fatalf("none of %d jobs fell in %s's shards", len(ids), id)
	}
	for _, jid := range ids {
		waitState(t, c, jid, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)
	}
	t.Logf("%d jobs through %s completed, %d of them in its shards", len(ids), id, inC4)

	stopped := time.Now()
	if err := proc.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("%s after SIGTERM: %v, want exit 0", id, err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("%s did not exit within 15 s of SIGTERM", id)
	}
	testutil.Eventually(t, 5*time.Second, "the three own every shard again", countsAre(chk, three, S))
	t.Logf("%s stopped: %v, Desired %s after SIGTERM", id, chk.Counts(), time.Since(stopped).Round(time.Millisecond))
	chk.CaughtUp(t, cli)
	if err := chk.Stop(); err != nil {
		t.Error(err)
	}
}

// countsAre is nil once the owner keys (as the checker saw them) are
// exactly Desired(ids).
func countsAre(chk *shardstest.Checker, ids []string, S int) func() error {
	return func() error {
		got := chk.Owners()
		for s, w := range shards.Desired(ids, S) {
			if got[s].Member != w {
				return fmt.Errorf("shard %d owned by %q, want %s (counts %v)", s, got[s].Member, w, chk.Counts())
			}
		}
		return nil
	}
}

// cutProxy forwards TCP connections from its address to target until cut;
// heal listens on the same address again.
type cutProxy struct {
	addr, target string
	mu           sync.Mutex
	lis          net.Listener
	conns        []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	p := &cutProxy{addr: testutil.FreeAddr(t), target: target}
	if err := p.heal(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) heal() error {
	lis, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.lis = lis
	p.mu.Unlock()
	go func() {
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", p.target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	return nil
}

// cut closes the listener and every connection: the client behind it
// reaches no etcd (connections refused) until heal.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lis != nil {
		p.lis.Close()
		p.lis = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestClientOnlyCoordinatorOutlivesEtcdLoss: a client-only coordinator that
// loses etcd (its only endpoint refuses connections) does not fail: its
// session lease lapses, the members take its shards over, it logs that
// etcd does not answer, and when etcd is back it rejoins and takes its
// share again. No shard has two owners at any revision.
func TestClientOnlyCoordinatorOutlivesEtcdLoss(t *testing.T) {
	const S = 64
	cfgs, logs := memberRegion(t, 3, S)
	members := startCoords(t, cfgs, logs)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cfgs[0].Etcd.ClientURL, cfgs[1].Etcd.ClientURL, cfgs[2].Etcd.ClientURL},
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	chk := shardstest.WatchNoDoubleOwner(t, cli, shards.Layout{Prefix: shards.DefaultPrefix, Count: S}, shardstest.FromRevision(1))

	proxy := newCutProxy(t, strings.TrimPrefix(cfgs[0].Etcd.ClientURL, "http://"))
	cfg4, log4 := clientOnly(t, "c4", cfgs)
	cfg4.Etcd.Endpoints = []string{"http://" + proxy.addr}
	c4 := startCoords(t, []regional.Config{cfg4}, []*testutil.LogBuffer{log4})[0]
	three, four := []string{"c1", "c2", "c3"}, []string{"c1", "c2", "c3", "c4"}
	all := append(slices.Clone(members), c4)
	testutil.Eventually(t, 15*time.Second, "c4 owns its Desired share", ownsDesired(all, four, S, chk))

	cut := time.Now()
	proxy.cut()
	testutil.Eventually(t, 10*time.Second, "the members own every shard without c4", ownsDesired(members, three, S, chk))
	t.Logf("etcd cut off from c4: the members own %v %s later", counts(members, three), time.Since(cut).Round(time.Millisecond))
	testutil.Eventually(t, 5*time.Second, "c4 owns nothing", func() error {
		if n := len(c4.OwnedShards()); n != 0 {
			return fmt.Errorf("c4 still owns %d shards", n)
		}
		return nil
	})
	testutil.Eventually(t, 10*time.Second, "c4 warns", func() error {
		if !strings.Contains(log4.Tail(1<<20), "etcd does not answer through --etcd-endpoints") {
			return errors.New("no warning in c4's log yet")
		}
		return nil
	})
	if err := c4.Err(); err != nil {
		t.Fatalf("c4 failed when etcd was cut off: %v", err)
	}

	healed := time.Now()
	if err := proxy.heal(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, "c4 owns its Desired share again", ownsDesired(all, four, S, chk))
	t.Logf("etcd back: %v %s later", counts(all, four), time.Since(healed).Round(time.Millisecond))
	testutil.Eventually(t, 5*time.Second, "c4 says etcd is back", func() error {
		if !strings.Contains(log4.Tail(1<<20), "etcd answers again through --etcd-endpoints") {
			return errors.New("not in c4's log yet")
		}
		return nil
	})
	chk.CaughtUp(t, cli)
	if err := chk.Stop(); err != nil {
		t.Error(err)
	}
}

// TestSameIDRefusedOrTakenOver: a second coordinator started with the id of
// a live one fails to start, naming it (the two would take each other's
// member key); one started with the id of a crashed one revokes the dead
// one's lease at once, so its shards move without waiting for it to lapse.
func TestSameIDRefusedOrTakenOver(t *testing.T) {
	cfgs, logs := memberRegion(t, 1, 16)
	cfgs[0].OwnerLeaseTTL = 30 * time.Second // only a revoke can end it within the test
	// No suspicion at c1: only the restarted c2's own check may revoke the
	// crashed c2's lease.
	cfgs[0].SuspectAfter, cfgs[0].LANAddr = -1, ""
	cs := startCoords(t, cfgs, logs)
	testutil.Eventually(t, 10*time.Second, "c1 owns every shard", func() error {
		if n := len(cs[0].OwnedShards()); n != 16 {
			return fmt.Errorf("c1 owns %d", n)
		}
		return nil
	})
	twin, _ := clientOnly(t, "c1", cfgs)
	tc, err := regional.New(twin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = tc.Start(ctx)
	if err == nil {
		tc.Stop()
		t.Fatal("a second coordinator with a live coordinator's id started")
	}
	if !strings.Contains(err.Error(), "coordinator id c1 is in use by a live coordinator at "+cs[0].Addr()) {
		t.Fatalf("refusal: %v", err)
	}
	if n := len(cs[0].OwnedShards()); n != 16 {
		t.Fatalf("the refused twin took shards from c1: it owns %d", n)
	}

	// c2 (client-only) joins, then crashes; a new c2 revokes its lease.
	c2cfg, c2log := clientOnly(t, "c2", cfgs)
	c2cfg.OwnerLeaseTTL = 30 * time.Second
	c2 := startCoords(t, []regional.Config{c2cfg}, []*testutil.LogBuffer{c2log})[0]
	testutil.Eventually(t, 15*time.Second, "c2 owns shards", func() error {
		if len(c2.OwnedShards()) == 0 {
			return errors.New("c2 owns none")
		}
		return nil
	})
	c2.Kill()
	again, againLog := clientOnly(t, "c2", cfgs)
	start := time.Now()
	c2b := startCoords(t, []regional.Config{again}, []*testutil.LogBuffer{againLog})[0]
	if !strings.Contains(againLog.Tail(20000), "revoked the lease of this id's previous run") {
		t.Fatalf("the restarted c2 did not revoke its predecessor's lease:\n%s", againLog.Tail(3000))
	}
	testutil.Eventually(t, 15*time.Second, "the restarted c2 owns shards", func() error {
		if len(c2b.OwnedShards()) == 0 {
			return errors.New("c2 owns none")
		}
		return nil
	})
	t.Logf("restarted c2 owns shards %v after its start (the old lease had 30 s to run)", time.Since(start).Round(time.Millisecond))
}
