package regional

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"

	apiarytest "apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/regional/store"
)

// memberCfg is a plaintext one-member etcd config on free loopback ports.
func memberCfg(t *testing.T, dir, name string) EtcdConfig {
	return EtcdConfig{Name: name, DataDir: dir, ClientURL: "http://" + apiarytest.FreeAddr(t), PeerURL: "http://" + apiarytest.FreeAddr(t)}
}

func startMember(t *testing.T, ctx context.Context, c EtcdConfig) (*embed.Etcd, *clientv3.Client) {
	t.Helper()
	e, err := startEtcd(ctx, c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cli := v3client.New(e.Server)
	t.Cleanup(func() { cli.Close(); e.Close() })
	return e, cli
}

// churn writes n values of size bytes under prefix, deletes them and
// compacts physically: their pages become free pages of the backend file.
func churn(t *testing.T, ctx context.Context, cli *clientv3.Client, prefix string, n, size int) {
	t.Helper()
	val := strings.Repeat("x", size)
	for i := range n {
		if _, err := cli.Put(ctx, fmt.Sprintf("%s%05d", prefix, i), val); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.Delete(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
}

// The defragmentation step with a real etcd member: below the free-space
// rule it does nothing; with another member's lock in place it waits; with
// free pages past both thresholds it defragments and the backend file
// shrinks (etcd's Status), once per interval, counted in the metric.
func TestDefragStepShrinksTheBackend(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	c := memberCfg(t, t.TempDir(), "c1")
	e, cli := startMember(t, ctx, c)
	reg := prometheus.NewRegistry()
	c.DefragMinFreeBytes = 1 << 20
	d := newDefragger(c, e.Server, cli, nil, reg, slog.New(slog.DiscardHandler))
	if d.interval != DefaultDefragInterval || d.minFrac != DefaultDefragMinFreeFraction {
		t.Fatalf("defaults: interval %s, fraction %g", d.interval, d.minFrac)
	}
	if off := newDefragger(EtcdConfig{DefragInterval: -1}, e.Server, cli, nil, nil, slog.New(slog.DiscardHandler)); off != nil {
		t.Fatal("DefragInterval < 0 must turn the loop off")
	}

	// A fresh member: too little free space.
	out, err := d.step(ctx, time.Now())
	if err != nil || out.Done || !strings.Contains(out.Skip, "free") {
		t.Fatalf("fresh member: %+v, %v; want a skip for too little free space", out, err)
	}

	churn(t, ctx, cli, "/churn/", 400, 32<<10) // about 12.5 MiB written, all freed
	st, err := cli.Status(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after churn: DbSize %d, in use %d", st.DbSize, st.DbSizeInUse)
	if st.DbSize-st.DbSizeInUse < 4<<20 {
		t.Fatalf("churn made only %d free bytes", st.DbSize-st.DbSizeInUse)
	}

	// Another member holds the lock: wait.
	if _, err := cli.Put(ctx, store.KeyDefragLock, "c9"); err != nil {
		t.Fatal(err)
	}
	out, err = d.step(ctx, time.Now())
	if err != nil || out.Done || !strings.Contains(out.Skip, "member c9 is defragmenting") {
		t.Fatalf("with c9's lock: %+v, %v", out, err)
	}
	if _, err := cli.Delete(ctx, store.KeyDefragLock); err != nil {
		t.Fatal(err)
	}

	out, err = d.step(ctx, time.Now())
	if err != nil || !out.Done {
		t.Fatalf("defrag step: %+v, %v; want a defragmentation", out, err)
	}
	after, err := cli.Status(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("defragmented in %s: DbSize %d -> %d (status %d)", out.Took, out.Before, out.After, after.DbSize)
	if out.After <= 0 || after.DbSize >= st.DbSize || st.DbSize-after.DbSize < 4<<20 {
		t.Fatalf("DbSize %d -> %d: did not shrink by the freed pages", st.DbSize, after.DbSize)
	}
	var m dto.Metric
	if err := d.count.WithLabelValues("ok").Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 1 {
		t.Fatalf("%s{result=ok} = %g, want 1", MetricEtcdDefrags, got)
	}
	if resp, err := cli.Get(ctx, store.KeyDefragLock); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the lock outlived the defragmentation: %v, %v", resp, err)
	}

	// Once per interval, however much is free.
	churn(t, ctx, cli, "/churn2/", 200, 32<<10)
	out, err = d.step(ctx, time.Now())
	if err != nil || out.Done || !strings.Contains(out.Skip, "at most one per 1h0m0s") {
		t.Fatalf("second step within the interval: %+v, %v", out, err)
	}
}

// saveSnapshotFile writes the snapshot of the member at clientURL to path
// (what `apiary region snapshot save` receives).
func saveSnapshotFile(t *testing.T, ctx context.Context, clientURL string, path string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{clientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// A snapshot of a one-member region restores into a three-member region:
// RestoreSnapshot with three names and the same --initial-cluster makes
// three data dirs that etcd starts from as one cluster, holding the
// snapshot's keys at revisions above the bump. The restore refuses what
// would go wrong (a data dir with a member, a name not in the cluster, a
// damaged file). Then the defragmentation rules across members: the
// leader hands leadership over before it defragments, and no member
// defragments while another does not answer.
func TestRestoreSnapshotThreeMembers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
	defer cancel()
	dir := t.TempDir()
	src := memberCfg(t, filepath.Join(dir, "src"), "c1")
	e, err := startEtcd(ctx, src, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cli := v3client.New(e.Server)
	for i := range 20 {
		if _, err := cli.Put(ctx, fmt.Sprintf("/apiary/jobs/00001/job-%02d", i), fmt.Sprintf("spec %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	last, err := cli.Put(ctx, store.KeyMeta, `{"region":"eu-west"}`)
	if err != nil {
		t.Fatal(err)
	}
	snapPath := filepath.Join(dir, "snap.db")
	saveSnapshotFile(t, ctx, src.ClientURL, snapPath)
	cli.Close()
	e.Close()

	info, err := CheckSnapshot(snapPath)
	if err != nil {
		t.Fatal(err)
	}
	if info.Revision != last.Header.Revision || len(info.SHA256) != 64 {
		t.Fatalf("CheckSnapshot = %+v, want revision %d", info, last.Header.Revision)
	}
	// A damaged copy fails the sha256 check, in CheckSnapshot and in etcd's restore.
	b, err := os.ReadFile(snapPath)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	bad := filepath.Join(dir, "bad.db")
	if err := os.WriteFile(bad, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckSnapshot(bad); err == nil || !strings.Contains(err.Error(), "sha256 mismatch") {
		t.Fatalf("CheckSnapshot of a damaged file: %v", err)
	}
	if err := os.WriteFile(bad, b[:len(b)-100], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckSnapshot(bad); err == nil || !strings.Contains(err.Error(), "512*k + 32") {
		t.Fatalf("CheckSnapshot of a truncated file: %v", err)
	}

	names := []string{"c1", "c2", "c3"}
	cfgs := make([]EtcdConfig, 3)
	var cluster []string
	for i, n := range names {
		cfgs[i] = memberCfg(t, filepath.Join(dir, n), n)
		cluster = append(cluster, n+"="+cfgs[i].PeerURL)
	}
	initial := strings.Join(cluster, ",")
	if err := RestoreSnapshot(RestoreConfig{SnapshotPath: snapPath, DataDir: filepath.Join(dir, "x"), Name: "c4", InitialCluster: initial}); err == nil ||
		!strings.Contains(err.Error(), `has no member "c4"`) {
		t.Fatalf("a name not in the cluster: %v", err)
	}
	if err := RestoreSnapshot(RestoreConfig{SnapshotPath: snapPath, DataDir: filepath.Join(dir, "x"), Name: "c1", PeerURL: "http://127.0.0.1:1",
		InitialCluster: initial}); err == nil || !strings.Contains(err.Error(), "--etcd-peer-url") {
		t.Fatalf("a peer URL that is not the cluster's: %v", err)
	}
	if err := RestoreSnapshot(RestoreConfig{SnapshotPath: bad, DataDir: filepath.Join(dir, "x"), Name: "c1", InitialCluster: initial}); err == nil {
		t.Fatal("restored a truncated snapshot")
	}
	if _, err := os.Stat(filepath.Join(dir, "x", "member")); !os.IsNotExist(err) {
		t.Fatalf("a failed restore left a member dir: %v", err)
	}
	const bump = 1_000_000
	for i, n := range names {
		// The data dir may exist (the gossip keyrings live there).
		if err := os.MkdirAll(cfgs[i].DataDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := RestoreSnapshot(RestoreConfig{SnapshotPath: snapPath, DataDir: cfgs[i].DataDir, Name: n, InitialCluster: initial, RevisionBump: bump}); err != nil {
			t.Fatalf("restore %s: %v", n, err)
		}
		left, _ := filepath.Glob(filepath.Join(cfgs[i].DataDir, ".restore-*"))
		if len(left) != 0 {
			t.Fatalf("restore %s left %v", n, left)
		}
	}
	if err := RestoreSnapshot(RestoreConfig{SnapshotPath: snapPath, DataDir: cfgs[0].DataDir, Name: "c1", InitialCluster: initial}); err == nil ||
		!strings.Contains(err.Error(), "holds an etcd member already") {
		t.Fatalf("restore over a member: %v", err)
	}

	// Start the three members at once (each waits for a quorum), as
	// `apiary region` starts them: the same --initial-cluster.
	members := make([]*embed.Etcd, 3)
	closed := make([]bool, 3)
	clis := make([]*clientv3.Client, 3)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range names {
		cfgs[i].InitialCluster = initial
		wg.Go(func() {
			members[i], errs[i] = startEtcd(ctx, cfgs[i], slog.New(slog.DiscardHandler))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start restored member %s: %v", names[i], err)
		}
		clis[i] = v3client.New(members[i].Server)
		t.Cleanup(func() {
			clis[i].Close()
			if !closed[i] {
				members[i].Close()
			}
		})
	}
	for i, cl := range clis {
		resp, err := cl.Get(ctx, "/apiary/jobs/", clientv3.WithPrefix())
		if err != nil {
			t.Fatalf("%s: %v", names[i], err)
		}
		if len(resp.Kvs) != 20 || string(resp.Kvs[7].Value) != "spec 7" {
			t.Fatalf("%s holds %d jobs, want the snapshot's 20", names[i], len(resp.Kvs))
		}
		if resp.Header.Revision < info.Revision+bump {
			t.Fatalf("%s at revision %d, want >= %d (bumped)", names[i], resp.Header.Revision, info.Revision+bump)
		}
		if ms := members[i].Server.Cluster().Members(); len(ms) != 3 {
			t.Fatalf("%s sees %d members", names[i], len(ms))
		}
	}
	put, err := clis[1].Put(ctx, "/after-restore", "x")
	if err != nil || put.Header.Revision <= info.Revision+bump {
		t.Fatalf("write after restore: %v, %v", put, err)
	}

	// Defragmentation across members: the leader hands leadership over first.
	churn(t, ctx, clis[0], "/churn/", 200, 32<<10)
	lead := -1
	for i, m := range members {
		if m.Server.Leader() == m.Server.MemberID() {
			lead = i
		}
	}
	if lead < 0 {
		t.Fatal("no leader")
	}
	// Each member compacts when it applies the compaction, and bbolt
	// frees the pages at a later write of that member: write on.
	// Every member: the step of the member left running below must get
	// past its own free-pages check to reach the peers' (a follower may
	// free its pages after the leader).
	apiarytest.Eventually(t, 10*time.Second, "free pages on every member", func() error {
		if _, err := clis[0].Put(ctx, "/tick", "x"); err != nil {
			return err
		}
		for i, cli := range clis {
			st, err := cli.Status(ctx, "")
			if err != nil {
				return err
			}
			if free := st.DbSize - st.DbSizeInUse; free < 2<<20 || 4*free < st.DbSize {
				return fmt.Errorf("%s: %d bytes free of %d", names[i], free, st.DbSize)
			}
		}
		return nil
	})
	ld := newDefragger(EtcdConfig{Name: names[lead], DefragMinFreeBytes: 1 << 20}, members[lead].Server, clis[lead], nil, nil, slog.New(slog.DiscardHandler))
	out, err := ld.step(ctx, time.Now())
	if err != nil || !out.Done {
		t.Fatalf("leader's defrag step: %+v, %v", out, err)
	}
	if members[lead].Server.Leader() == members[lead].Server.MemberID() {
		t.Fatalf("%s defragmented while leading", names[lead])
	}
	// One member stopped: no other member defragments.
	stopped := (lead + 1) % 3
	other := (lead + 2) % 3
	closed[stopped] = true
	members[stopped].Close()
	od := newDefragger(EtcdConfig{Name: names[other], DefragMinFreeBytes: 1 << 20}, members[other].Server, clis[other], nil, nil, slog.New(slog.DiscardHandler))
	out, err = od.step(ctx, time.Now())
	if err != nil || out.Done || !strings.Contains(out.Skip, "member "+names[stopped]+" does not answer") {
		t.Fatalf("with %s stopped, %s's step: %+v, %v", names[stopped], names[other], out, err)
	}
}
