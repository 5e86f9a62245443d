package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/shards"
)

// region shards' text: a summary row per owner (by id, the unowned last as
// "(none)", epochs min-max, summed tasks, the latest placement's age) and,
// with --all, a row per shard.
func TestPrintRegionShards(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) int64 { return now.Add(-d).UnixMilli() }
	resp := &apiaryv1.ListShardsResponse{ShardCount: 6, Revision: 77, Coordinator: "eu-west-c2", Shards: []*apiaryv1.Shard{
		{Shard: 0, Owner: "eu-west-c2", Epoch: 10, PendingTasks: 2, RunningTasks: 1, LastPlanMs: ago(3 * time.Second)},
		{Shard: 1, Owner: "eu-west-c1", Epoch: 12},
		{Shard: 2, Owner: "eu-west-c2", Epoch: 15, RunningTasks: 3, LastPlanMs: ago(125*time.Second + 400*time.Millisecond)},
		{Shard: 3},
		{Shard: 4, Owner: "eu-west-c1", Epoch: 12, PendingTasks: 1},
		{Shard: 5, PendingTasks: 4, LastPlanMs: now.Add(time.Second).UnixMilli()}, // a clock ahead
	}}
	var b bytes.Buffer
	printRegionShards(&b, resp, false, now)
	out := b.String()
	t.Logf("\n%s", out)
	for _, re := range []string{
		`^6 shards, answered by eu-west-c2 at etcd revision 77; unowned: 2 \(`,
		`(?m)^COORDINATOR\s+SHARDS\s+EPOCHS\s+PENDING\s+RUNNING\s+LAST PLAN$`,
		`(?m)^eu-west-c1\s+2\s+12\s+1\s+0\s+-\n` +
			`eu-west-c2\s+2\s+10-15\s+2\s+4\s+3s ago\n` +
			`\(none\)\s+2\s+-\s+4\s+0\s+0s ago\n$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("summary does not match %s", re)
		}
	}
	if strings.Contains(out, "SHARD\t") || strings.Contains(out, "OWNER") {
		t.Errorf("per-shard rows without --all")
	}

	b.Reset()
	printRegionShards(&b, resp, true, now)
	out = b.String()
	t.Logf("--all:\n%s", out)
	if !strings.Contains(out, "\n\nSHARD") {
		t.Fatal("no per-shard table after the summary")
	}
	for _, re := range []string{
		`(?m)^SHARD\s+OWNER\s+EPOCH\s+PENDING\s+RUNNING\s+LAST PLAN$`,
		`(?m)^0\s+eu-west-c2\s+10\s+2\s+1\s+3s ago\n` +
			`1\s+eu-west-c1\s+12\s+0\s+0\s+-\n` +
			`2\s+eu-west-c2\s+15\s+0\s+3\s+2m5s ago\n` +
			`3\s+\(none\)\s+-\s+0\s+0\s+-\n` +
			`4\s+eu-west-c1\s+12\s+1\s+0\s+-\n` +
			`5\s+\(none\)\s+-\s+4\s+0\s+0s ago\n$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("--all does not match %s", re)
		}
	}

	// Every shard owned: no "(none)" row, no unowned note.
	b.Reset()
	printRegionShards(&b, &apiaryv1.ListShardsResponse{ShardCount: 1, Revision: 5, Coordinator: "c1",
		Shards: []*apiaryv1.Shard{{Shard: 0, Owner: "c1", Epoch: 4}}}, false, now)
	if out := b.String(); strings.Contains(out, "(none)") || strings.Contains(out, "unowned") ||
		!regexp.MustCompile(`(?m)^c1\s+1\s+4\s+0\s+0\s+-$`).MatchString(out) {
		t.Errorf("one owned shard:\n%s", out)
	}
}

// region status's "Shards:" line and SHARDS column, from GetRegionInfo's
// per-coordinator counts.
func TestPrintRegionStatusShards(t *testing.T) {
	resp := &apiaryv1.GetRegionInfoResponse{Region: "eu-west", ShardCount: 256, SchedulerEpoch: 123, Scheduler: "c1", EtcdLeader: "c3",
		Coordinators: []*apiaryv1.Coordinator{
			{Id: "c1", ApiAddr: "127.0.0.1:7071", Scheduler: true, ShardsOwned: 86},
			{Id: "c2", ApiAddr: "127.0.0.1:7072", Scheduler: true, ShardsOwned: 85},
			{Id: "c3", ApiAddr: "127.0.0.1:7073"},
		}}
	api := map[string]string{"c1": "answers", "c2": "answers", "c3": "no answer (connection refused)"}
	var b bytes.Buffer
	printRegionStatus(&b, resp, api)
	out := b.String()
	t.Logf("\n%s", out)
	for _, re := range []string{
		`(?m)^Shards:\s+256 \(c1 86, c2 85; unowned: 85; highest epoch 123\)$`,
		`(?m)^COORDINATOR\s+API ADDRESS\s+API\s+SHARDS\s+ROLE$`,
		`(?m)^c1\s+127\.0\.0\.1:7071\s+answers\s+86\s+scheduler$`,
		`(?m)^c2\s+127\.0\.0\.1:7072\s+answers\s+85\s+scheduler$`,
		`(?m)^c3\s+127\.0\.0\.1:7073\s+no answer \(connection refused\)\s+0\s+etcd leader$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("region status does not match %s", re)
		}
	}
	if strings.Contains(out, "owns all") || strings.Contains(out, "Scheduler:") {
		t.Errorf("region status still speaks of one scheduler owning all shards")
	}

	// All owned; then none owned; then the top owner's member record gone.
	resp.Coordinators[2].ShardsOwned, resp.Coordinators[2].Scheduler = 85, true
	if got, want := shardOwnership(resp), "256 (c1 86, c2 85, c3 85; highest epoch 123)"; got != want {
		t.Errorf("all owned: %q, want %q", got, want)
	}
	none := &apiaryv1.GetRegionInfoResponse{ShardCount: 8, Coordinators: []*apiaryv1.Coordinator{{Id: "c1"}}}
	if got := shardOwnership(none); !strings.HasPrefix(got, "8 (unowned: 8 (no live coordinator owns a shard") {
		t.Errorf("none owned: %q", got)
	}
	lapsed := &apiaryv1.GetRegionInfoResponse{ShardCount: 8, Scheduler: "c9", SchedulerEpoch: 40,
		Coordinators: []*apiaryv1.Coordinator{{Id: "c1", Scheduler: true, ShardsOwned: 3}}}
	if got := shardOwnership(lapsed); !strings.HasPrefix(got, "8 (c1 3; unowned: 5; highest epoch 40); c9 owns shards but its member record has lapsed") {
		t.Errorf("lapsed owner: %q", got)
	}
}

// olderCoordinator serves GetRegionInfo but not ListShards, as a
// coordinator of an apiary before region shards does.
type olderCoordinator struct {
	apiaryv1.UnimplementedAdminServiceServer
}

func (olderCoordinator) GetRegionInfo(context.Context, *apiaryv1.GetRegionInfoRequest) (*apiaryv1.GetRegionInfoResponse, error) {
	return &apiaryv1.GetRegionInfoResponse{Region: "eu-west", ShardCount: 256}, nil
}

// A server that does not serve ListShards but answers GetRegionInfo is an
// older coordinator, not a router: exit 2 saying so, without a router hint.
func TestCLIRegionShardsOlderCoordinator(t *testing.T) {
	l := testutil.Listen(t)
	s := grpc.NewServer()
	apiaryv1.RegisterAdminServiceServer(s, olderCoordinator{})
	go s.Serve(l)
	t.Cleanup(s.Stop)
	res := runCLI(t, nil, "region", "shards", "--addr", l.Addr().String())
	t.Logf("exit %d\n%s%s", res.code, res.stdout, res.stderr)
	if res.code != exitInvalid || !strings.Contains(res.stderr, "the coordinator at "+l.Addr().String()+" does not serve region shards") ||
		strings.Contains(res.stderr, "global router") || res.stdout != "" {
		t.Fatalf("region shards against an older coordinator: exit %d", res.code)
	}
}

// shardsSummaryRow is one owner row of region shards' text summary.
var shardsSummaryRow = regexp.MustCompile(`(?m)^(\S+)\s+(\d+)\s+(\d+(?:-\d+)?|-)\s+\d+\s+\d+\s+\S+(?: ago)?$`)

// A 3-coordinator region behind a global router: once ownership settles,
// `region shards` (text, --all, -o json) accounts for every shard with the
// three coordinators' counts summing to the shard count, as `region status`
// does and as `region list` (through the router and against a coordinator,
// from the WAN tags) does; against the router `region shards` exits 2
// naming the coordinators to ask.
func TestCLIRegionShards(t *testing.T) {
	start := time.Now()
	cl := aclCluster(t, true, devcluster.RegionSpec{Name: "eu-west", Jurisdiction: "eu", Coordinators: 3})
	r := cl.Regions[0]
	env := cl.ClientEnv()
	t.Logf("cluster up after %v", time.Since(start).Round(100*time.Millisecond))

	// Settled: every shard owned as the rendezvous assignment of the three
	// live members says (until then shards move, and one may be unowned
	// for a moment between a hand-back and the claim).
	var ids []string
	for _, p := range r.Coords {
		ids = append(ids, p.Name)
	}
	var list apiaryv1.ListShardsResponse
	var per map[string]int
	testutil.Eventually(t, 20*time.Second, "every shard owned as the rendezvous assignment of the 3 coordinators", func() error {
		res := runCLI(t, env, "region", "shards", "-o", "json", "--addr", r.Addr())
		if res.code != 0 {
			return fmt.Errorf("exit %d: %s", res.code, res.stderr)
		}
		if err := protojson.Unmarshal([]byte(res.stdout), &list); err != nil {
			t.Fatalf("region shards -o json: %v\n%s", err, res.stdout)
		}
		if len(list.GetShards()) != int(list.GetShardCount()) || list.GetShardCount() <= 0 {
			t.Fatalf("region shards -o json: %d shards of %d", len(list.GetShards()), list.GetShardCount())
		}
		want := shards.Desired(ids, int(list.GetShardCount()))
		per = map[string]int{}
		moving := 0
		for i, s := range list.GetShards() {
			per[s.GetOwner()]++
			if s.GetOwner() != want[i] {
				moving++
			}
		}
		if moving > 0 {
			return fmt.Errorf("%d shards not yet with their rendezvous owner; owners %v", moving, per)
		}
		return nil
	})
	n := int(list.GetShardCount())
	if n != 256 || list.GetRevision() <= 0 || !strings.HasPrefix(list.GetCoordinator(), "eu-west-c") {
		t.Fatalf("region shards -o json: %d shards, revision %d, coordinator %q", n, list.GetRevision(), list.GetCoordinator())
	}
	for i, s := range list.GetShards() {
		if int(s.GetShard()) != i || s.GetEpoch() <= 0 || s.GetEpoch() > list.GetRevision() {
			t.Fatalf("shard %d: %v (revision %d)", i, s, list.GetRevision())
		}
	}
	t.Logf("settled after %v: %v", time.Since(start).Round(100*time.Millisecond), per)

	res := runCLI(t, env, "region", "shards", "--addr", r.Addr())
	t.Logf("region shards:\n%s%s", res.stdout, res.stderr)
	if res.code != 0 || !regexp.MustCompile(`^256 shards, answered by eu-west-c\d at etcd revision \d+\n`).MatchString(res.stdout) {
		t.Fatalf("region shards: exit %d", res.code)
	}
	sum, rows := 0, 0
	for _, m := range shardsSummaryRow.FindAllStringSubmatch(res.stdout, -1) {
		k, _ := strconv.Atoi(m[2])
		if k != per[m[1]] || m[1] == "(none)" {
			t.Errorf("summary row %q: %s owns %d shards in -o json", m[0], m[1], per[m[1]])
		}
		sum += k
		rows++
	}
	if rows != 3 || sum != n {
		t.Fatalf("summary: %d coordinator rows owning %d shards, want 3 owning %d", rows, sum, n)
	}

	res = runCLI(t, env, "region", "shards", "--all", "--addr", r.APIAddrs[1])
	perShard := regexp.MustCompile(`(?m)^\d+\s+eu-west-c\d\s+\d+\s+\d+\s+\d+\s+(?:-|\S+ ago)$`).FindAllString(res.stdout, -1)
	if res.code != 0 || len(perShard) != n {
		t.Fatalf("region shards --all: exit %d, %d shard rows, want %d\n%s%s", res.code, len(perShard), n, res.stdout, res.stderr)
	}

	// region status counts the same ownership per coordinator.
	res = runCLI(t, env, "region", "status", "--addr", r.Addr())
	t.Logf("region status:\n%s%s", res.stdout, res.stderr)
	line := regexp.MustCompile(`(?m)^Shards:\s+256 \((eu-west-c\d \d+), (eu-west-c\d \d+), (eu-west-c\d \d+); highest epoch \d+\)$`).
		FindStringSubmatch(res.stdout)
	col := regexp.MustCompile(`(?m)^eu-west-c\d\s+127\.0\.0\.1:\d+\s+answers\s+(\d+)\s+scheduler`).FindAllStringSubmatch(res.stdout, -1)
	colSum := 0
	for _, m := range col {
		k, _ := strconv.Atoi(m[1])
		colSum += k
	}
	if res.code != 0 || line == nil || len(col) != 3 || colSum != n {
		t.Fatalf("region status: exit %d, Shards line %q, %d coordinator rows owning %d shards", res.code, line, len(col), colSum)
	}

	// region list shows the same ownership per coordinator from the WAN
	// tags, through the router (-o json and text) and against a
	// coordinator (its own WAN view); the tags follow within a refresh.
	listed := regexp.MustCompile(`(eu-west-c\d)\(alive,answers,[a-z-]+,(\d+) shards\)`)
	for _, addr := range []string{cl.GlobalAddr, r.APIAddrs[2]} {
		testutil.Eventually(t, 15*time.Second, "region list at "+addr+" shows each coordinator's shards as region shards does", func() error {
			res := runCLI(t, env, "region", "list", "-o", "json", "--addr", addr)
			if res.code != 0 {
				return fmt.Errorf("exit %d: %s", res.code, res.stderr)
			}
			var regions apiaryv1.ListRegionsResponse
			if err := protojson.Unmarshal([]byte(res.stdout), &regions); err != nil {
				t.Fatalf("region list -o json: %v\n%s", err, res.stdout)
			}
			got, sum := map[string]int{}, 0
			for _, reg := range regions.GetRegions() {
				for _, co := range reg.GetCoordinators() {
					got[co.GetId()] = int(co.GetShardsOwned())
					sum += int(co.GetShardsOwned())
				}
			}
			if len(got) != 3 || sum != n || fmt.Sprint(got) != fmt.Sprint(per) {
				return fmt.Errorf("shards_owned %v (sum %d), want %v (sum %d)", got, sum, per, n)
			}
			res = runCLI(t, env, "region", "list", "--addr", addr)
			text, sum := map[string]int{}, 0
			for _, m := range listed.FindAllStringSubmatch(res.stdout, -1) {
				k, _ := strconv.Atoi(m[2])
				text[m[1]] = k
				sum += k
			}
			if res.code != 0 || len(text) != 3 || sum != n || fmt.Sprint(text) != fmt.Sprint(per) {
				return fmt.Errorf("text: exit %d, shards %v (sum %d), want %v\n%s%s", res.code, text, sum, per, res.stdout, res.stderr)
			}
			t.Logf("region list at %s:\n%s", addr, res.stdout)
			return nil
		})
	}

	// Against the router: exit 2, and the command to run for each region.
	res = runCLI(t, env, "region", "shards", "--addr", cl.GlobalAddr)
	t.Logf("region shards against the router: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	if res.code != exitInvalid || !strings.Contains(res.stderr, cl.GlobalAddr+" is a global router; region shards asks a region's coordinators") ||
		!regexp.MustCompile(`apiary region shards --addr \S+   # eu-west`).MatchString(res.stderr) {
		t.Fatalf("region shards against the router: exit %d", res.code)
	}
	for _, a := range r.APIAddrs {
		if !strings.Contains(res.stderr, a) {
			t.Errorf("the hint lacks coordinator %s", a)
		}
	}
	t.Logf("took %v", time.Since(start).Round(100*time.Millisecond))
}
