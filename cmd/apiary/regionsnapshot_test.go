package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/regional"
)

// startSnapRegion runs `apiary region` (one member, c1 of eu-west) on
// dataDir with the given peer URL, and waits until it serves; it returns
// the process and its API address.
func startSnapRegion(t *testing.T, dataDir, peerURL string) (*proc, string) {
	t.Helper()
	api := testutil.FreeAddr(t)
	ready := filepath.Join(t.TempDir(), "ready")
	p := startProc(t, "region", "--insecure-dev", "--id", "c1", "--region", "eu-west", "--jurisdiction", "eu", "--shards", "16",
		"--data-dir", dataDir, "--listen", api, "--etcd-client-url", "http://"+testutil.FreeAddr(t), "--etcd-peer-url", peerURL,
		"--ready-file", ready)
	waitFile(t, p, ready)
	return p, api
}

// A one-member region, saved and restored as an operator would, with the
// real binary: `region status` shows the state size; `region snapshot
// save` writes a checked file; the region is stopped; `region snapshot
// restore` makes a fresh data dir from the file (and refuses one that
// holds a member); a region started on it has every job the snapshot
// held, at revisions above the bump.
func TestRegionSnapshotSaveRestoreOneMember(t *testing.T) {
	dir := t.TempDir()
	peer := "http://" + testutil.FreeAddr(t)
	p, api := startSnapRegion(t, filepath.Join(dir, "c1"), peer)

	conn, err := cliconn.Dial(api)
	if err != nil {
		t.Fatal(err)
	}
	jobs := apiaryv1.NewJobServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	var ids []string
	for i := range 3 {
		spec, err := jobspec.Parse(fmt.Appendf(nil, "name: snap-%d\ntasks: [{name: t, command: 'true'}]\n", i))
		if err != nil {
			t.Fatal(err)
		}
		jobspec.ApplyDefaults(spec)
		resp, err := jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: "snap", RequestId: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.GetJobId())
	}
	conn.Close()

	st := runCLI(t, nil, "region", "status", "--addr", api)
	t.Logf("region status:\n%s%s", st.stdout, st.stderr)
	if st.code != 0 || !regexp.MustCompile(`(?m)^State:\s+[\d.]+ [KM]iB \([\d.]+ [KM]iB in use\) of 4\.0 GiB \(0% of the quota\)$`).MatchString(st.stdout) {
		t.Fatalf("region status: exit %d, no State line with the 4 GiB quota", st.code)
	}
	list := runCLI(t, nil, "region", "list", "--addr", api)
	t.Logf("region list:\n%s%s", list.stdout, list.stderr)
	if list.code != 0 || !regexp.MustCompile(`(?m)^REGION\s+JURISDICTION\s+STATUS\s+COORDINATORS\s+NODES\s+STATE\s`).MatchString(list.stdout) ||
		!regexp.MustCompile(`(?m)^eu-west\s.*\s0\s+[\d.]+[KM]iB/4\.0GiB\s`).MatchString(list.stdout) {
		t.Fatalf("region list: exit %d, no STATE column with the region's size and quota", list.code)
	}
	// -o json carries the same sizes.
	js := runCLI(t, nil, "region", "list", "--addr", api, "-o", "json")
	var listed apiaryv1.ListRegionsResponse
	if js.code != 0 || protojson.Unmarshal([]byte(js.stdout), &listed) != nil || len(listed.GetRegions()) != 1 ||
		listed.GetRegions()[0].GetStateSizeBytes() <= 0 || listed.GetRegions()[0].GetStateInUseBytes() <= 0 ||
		listed.GetRegions()[0].GetStateQuotaBytes() != 4<<30 {
		t.Fatalf("region list -o json: exit %d, no state sizes with the 4 GiB quota:\n%s%s", js.code, js.stdout, js.stderr)
	}

	file := filepath.Join(dir, "eu-west.db")
	save := runCLI(t, nil, "region", "snapshot", "save", file, "--addr", api)
	t.Logf("snapshot save: %s%s", save.stdout, save.stderr)
	m := regexp.MustCompile(`^Saved a snapshot of region eu-west to .*eu-west\.db: [\d.]+ [KM]iB \((\d+) bytes\), etcd revision (\d+), sha256 [0-9a-f]{64}\n$`).
		FindStringSubmatch(save.stdout)
	if save.code != 0 || m == nil {
		t.Fatalf("snapshot save: exit %d", save.code)
	}
	fi, err := os.Stat(file)
	if err != nil || fmt.Sprint(fi.Size()) != m[1] || fi.Mode().Perm() != 0o600 {
		t.Fatalf("saved file: %v, %v (want %s bytes, mode 0600)", fi, err, m[1])
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".eu-west.db.tmp-*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	info, err := regional.CheckSnapshot(file)
	if err != nil || fmt.Sprint(info.Revision) != m[2] {
		t.Fatalf("CheckSnapshot: %+v, %v; the CLI said revision %s", info, err, m[2])
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.exit(t, 30*time.Second); code != 0 {
		t.Fatalf("region exit %d after SIGTERM:\n%s", code, p.out.String())
	}

	fresh := filepath.Join(dir, "c1-restored")
	res := runCLI(t, nil, "region", "snapshot", "restore", file, "--data-dir", fresh, "--name", "c1", "--etcd-peer-url", peer)
	t.Logf("snapshot restore: %s%s", res.stdout, res.stderr)
	if res.code != 0 || !strings.Contains(res.stdout, "into "+filepath.Join(fresh, "member")+" as etcd member c1") ||
		!strings.Contains(res.stdout, "apiary region --id c1 --data-dir "+fresh+" --etcd-peer-url "+peer) {
		t.Fatalf("snapshot restore: exit %d", res.code)
	}
	again := runCLI(t, nil, "region", "snapshot", "restore", file, "--data-dir", fresh, "--name", "c1", "--etcd-peer-url", peer)
	if again.code != 2 || !strings.Contains(again.stderr, "holds an etcd member already") {
		t.Fatalf("restore over a member: exit %d: %s", again.code, again.stderr)
	}

	_, api2 := startSnapRegion(t, fresh, peer)
	conn2, err := cliconn.Dial(api2)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	jobs2 := apiaryv1.NewJobServiceClient(conn2)
	for i, id := range ids {
		j, err := jobs2.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: id})
		if err != nil || j.GetJob().GetSpec().GetName() != fmt.Sprintf("snap-%d", i) {
			t.Fatalf("job %s after the restore: %v, %v", id, j.GetJob().GetSpec().GetName(), err)
		}
	}
	ri, err := apiaryv1.NewAdminServiceClient(conn2).GetRegionInfo(ctx, &apiaryv1.GetRegionInfoRequest{})
	if err != nil || ri.GetRevision() < info.Revision+regional.DefaultRevisionBump {
		t.Fatalf("restored region at revision %d, %v; want >= %d (bumped)", ri.GetRevision(), err, info.Revision+regional.DefaultRevisionBump)
	}
}

// snapshot save against something that is not a coordinator (a router,
// here a fake that serves neither GetRegionInfo nor SaveSnapshot): exit 2
// saying so, and no file; a missing directory or a damaged file: exit 2
// before anything is dialled or restored.
func TestRegionSnapshotRefusals(t *testing.T) {
	_, addr := startFake(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "s.db")
	r := runCLI(t, nil, "region", "snapshot", "save", file, "--addr", addr)
	if r.code != 2 || !strings.Contains(r.stderr, "is a global router") {
		t.Fatalf("save against a router: exit %d: %s", r.code, r.stderr)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("files left: %v", ents)
	}
	r = runCLI(t, nil, "region", "snapshot", "save", filepath.Join(dir, "no", "s.db"), "--addr", closedAddr(t))
	if r.code != 2 || !strings.Contains(r.stderr, "no such file or directory") {
		t.Fatalf("save into a missing dir: exit %d: %s", r.code, r.stderr)
	}
	if err := os.WriteFile(file, make([]byte, 1024+32), 0o600); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, nil, "region", "snapshot", "restore", file, "--data-dir", filepath.Join(dir, "d"), "--name", "c1")
	if r.code != 2 || !strings.Contains(r.stderr, "sha256 mismatch") {
		t.Fatalf("restore of a damaged file: exit %d: %s", r.code, r.stderr)
	}
	r = runCLI(t, nil, "region", "snapshot", "restore", file, "--data-dir", filepath.Join(dir, "d"))
	if r.code != 2 || !strings.Contains(r.stderr, `"name" not set`) {
		t.Fatalf("restore without --name: exit %d: %s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "d")); !os.IsNotExist(err) {
		t.Fatalf("a refused restore made the data dir: %v", err)
	}
}

// startSnapRegion3 runs the three members c1..c3 of eu-west on dirs with
// the peer URLs peers, all at once (each waits for a quorum), and waits
// until each serves; it returns their API addresses.
func startSnapRegion3(t *testing.T, dirs, peers []string) ([]*proc, []string) {
	t.Helper()
	var cluster []string
	for i, p := range peers {
		cluster = append(cluster, fmt.Sprintf("c%d=%s", i+1, p))
	}
	var procs []*proc
	var apis, readies []string
	for i := range 3 {
		api := testutil.FreeAddr(t)
		ready := filepath.Join(t.TempDir(), "ready")
		procs = append(procs, startProc(t, "region", "--insecure-dev", "--id", fmt.Sprintf("c%d", i+1), "--region", "eu-west",
			"--jurisdiction", "eu", "--shards", "16", "--data-dir", dirs[i], "--listen", api,
			"--etcd-client-url", "http://"+testutil.FreeAddr(t), "--etcd-peer-url", peers[i],
			"--initial-cluster", strings.Join(cluster, ","), "--ready-file", ready))
		apis, readies = append(apis, api), append(readies, ready)
	}
	for i, p := range procs {
		waitFile(t, p, readies[i])
	}
	return procs, apis
}

// A three-member region, saved through one coordinator and restored as
// README.md says: every member from the same file with its own --name and
// --data-dir and the full --initial-cluster, then all three started; every
// member serves the snapshot's jobs, and the restored etcd is one cluster
// of three.
func TestRegionSnapshotRestoreThreeMembers(t *testing.T) {
	dir := t.TempDir()
	var peers, dirs []string
	for i := range 3 {
		peers = append(peers, "http://"+testutil.FreeAddr(t))
		dirs = append(dirs, filepath.Join(dir, fmt.Sprintf("c%d", i+1)))
	}
	procs, apis := startSnapRegion3(t, dirs, peers)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	conn, err := cliconn.Dial(apis[1])
	if err != nil {
		t.Fatal(err)
	}
	spec, err := jobspec.Parse([]byte("name: three\ntasks: [{name: t, command: 'true'}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	jobspec.ApplyDefaults(spec)
	resp, err := apiaryv1.NewJobServiceClient(conn).SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: "snap", RequestId: "3"})
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "eu-west.db")
	if save := runCLI(t, nil, "region", "snapshot", "save", file, "--addr", apis[2]); save.code != 0 {
		t.Fatalf("snapshot save: exit %d: %s", save.code, save.stderr)
	}
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		p.exit(t, 30*time.Second)
	}

	var cluster []string
	for i, p := range peers {
		cluster = append(cluster, fmt.Sprintf("c%d=%s", i+1, p))
	}
	var fresh []string
	for i := range 3 {
		d := filepath.Join(dir, fmt.Sprintf("c%d-restored", i+1))
		fresh = append(fresh, d)
		r := runCLI(t, nil, "region", "snapshot", "restore", file, "--data-dir", d, "--name", fmt.Sprintf("c%d", i+1),
			"--initial-cluster", strings.Join(cluster, ","))
		if r.code != 0 || !strings.Contains(r.stdout, "Restore every other member") {
			t.Fatalf("restore c%d: exit %d: %s%s", i+1, r.code, r.stdout, r.stderr)
		}
	}
	_, apis2 := startSnapRegion3(t, fresh, peers)
	for i, api := range apis2 {
		conn, err := cliconn.Dial(api)
		if err != nil {
			t.Fatal(err)
		}
		j, err := apiaryv1.NewJobServiceClient(conn).GetJob(ctx, &apiaryv1.GetJobRequest{JobId: resp.GetJobId()})
		if err != nil || j.GetJob().GetSpec().GetName() != "three" {
			t.Fatalf("c%d after the restore: %v, %v", i+1, j.GetJob().GetSpec().GetName(), err)
		}
		conn.Close()
	}
	st := runCLI(t, nil, "region", "status", "--addr", strings.Join(apis2, ","))
	t.Logf("restored region:\n%s", st.stdout)
	if st.code != 0 || !regexp.MustCompile(`etcd leader:\s+c[123]`).MatchString(st.stdout) {
		t.Fatalf("region status after the restore: exit %d: %s", st.code, st.stderr)
	}
}
