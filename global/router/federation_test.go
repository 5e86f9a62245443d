package router_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

type fed struct {
	cl        *devcluster.Cluster
	eu, us    *devcluster.Region
	global    apiaryv1.JobServiceClient
	admin     apiaryv1.AdminServiceClient
	euDirect  apiaryv1.JobServiceClient
	usDirect  apiaryv1.JobServiceClient
	bin, addr string
	conns     []*grpc.ClientConn
}

// startFed starts a global router and two regions (one coordinator, one
// agent each) as real processes; us-east has a backlog bound of 50.
func startFed(t *testing.T) *fed {
	t.Helper()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(sovereignty.DefaultYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	agent := func(id string) []devcluster.AgentSpec {
		return []devcluster.AgentSpec{{ID: id, CPUMillis: 4000, MemoryMiB: 8192, Labels: map[string]string{"zone": "a", "class": "cloud"}}}
	}
	opts := devcluster.Options{Binary: testutil.Binary(t), Dir: dir, Global: &devcluster.GlobalSpec{PolicyFile: pol},
		Regions: []devcluster.RegionSpec{
			{Name: "eu-west", Jurisdiction: "eu", Labels: map[string]string{"jurisdiction": "eu", "tier": "standard"},
				Agents: agent("eu-n1"), ExtraArgs: []string{"--node-lease-ttl", "1s"}},
			{Name: "us-east", Jurisdiction: "us", Labels: map[string]string{"jurisdiction": "us", "tier": "standard"},
				Agents: agent("us-n1"), ExtraArgs: []string{"--node-lease-ttl", "1s", "--max-pending", "50"}},
		}}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, err := devcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	f := &fed{cl: cl, eu: cl.Regions[0], us: cl.Regions[1], bin: testutil.Binary(t), addr: cl.GlobalAddr}
	t.Cleanup(func() {
		for _, c := range f.conns {
			c.Close()
		}
		cl.Stop()
		if t.Failed() {
			for _, p := range append(append([]*devcluster.Proc{cl.Global}, f.eu.Coords...), f.us.Coords...) {
				b, _ := os.ReadFile(p.LogPath)
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("--- %s log tail ---\n%s", p.Name, b)
			}
		}
	})
	dial := func(addrs []string) *grpc.ClientConn {
		c, err := cliconn.Dial(strings.Join(addrs, ","))
		if err != nil {
			t.Fatal(err)
		}
		f.conns = append(f.conns, c)
		return c
	}
	g := dial([]string{cl.GlobalAddr})
	f.global, f.admin = apiaryv1.NewJobServiceClient(g), apiaryv1.NewAdminServiceClient(g)
	f.euDirect = apiaryv1.NewJobServiceClient(dial(f.eu.APIAddrs))
	f.usDirect = apiaryv1.NewJobServiceClient(dial(f.us.APIAddrs))
	return f
}

func spec(t *testing.T, y string) *apiaryv1.JobSpec {
	t.Helper()
	s, err := jobspec.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if err := jobspec.Validate(s); err != nil {
		t.Fatal(err)
	}
	return s
}

var reqN int

func submit(c apiaryv1.JobServiceClient, s *apiaryv1.JobSpec) (*apiaryv1.SubmitJobResponse, error) {
	reqN++
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	// An ephemeral key, as `apiary job run` without --request-id sends: the
	// router routes it by load (keyed requests go to their home region).
	return c.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: s, ClientId: "fedtest", RequestId: fmt.Sprintf("r%d-%d", reqN, time.Now().UnixNano()),
		EphemeralRequestId: true})
}

func mustSubmit(t *testing.T, c apiaryv1.JobServiceClient, s *apiaryv1.JobSpec) *apiaryv1.SubmitJobResponse {
	t.Helper()
	r, err := submit(c, s)
	if err != nil {
		t.Fatalf("submit %s: %v", s.GetName(), err)
	}
	return r
}

// cli runs the apiary binary against the router and returns its stdout
// and stderr together, and the exit code.
func (f *fed) cli(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, errOut, code := f.runAt(t, f.addr, args...)
	return out + errOut, code
}

func (f *fed) region(t *testing.T, name string) *apiaryv1.RegionSummary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := f.admin.ListRegions(ctx, &apiaryv1.ListRegionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.GetRegions() {
		if r.GetName() == name {
			return r
		}
	}
	t.Fatalf("region %s not listed", name)
	return nil
}

func (f *fed) countJobs(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := f.global.ListJobs(ctx, &apiaryv1.ListJobsRequest{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.GetJobs())
}

func waitState(t *testing.T, c apiaryv1.JobServiceClient, id string, want apiaryv1.JobState) *apiaryv1.Job {
	t.Helper()
	var j *apiaryv1.Job
	testutil.Eventually(t, 30*time.Second, "job "+id+" "+want.String(), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: id})
		if err != nil {
			return err
		}
		j = resp.GetJob()
		if j.GetState() != want {
			return fmt.Errorf("state %s", j.GetState())
		}
		return nil
	})
	return j
}

// TestFederation runs the scenarios on one federation, in an order
// where each leaves the next a known state; the region kill comes last.
func TestFederation(t *testing.T) {
	f := startFed(t)

	t.Run("eu job lands in eu-west even when eu-west is fuller", func(t *testing.T) {
		fill := mustSubmit(t, f.euDirect, spec(t, "name: filler\ntasks: [{name: s, command: sleep, args: ['20'], resources: {cpu_millis: 3000, memory_mb: 4096}}]\n"))
		waitState(t, f.euDirect, fill.GetJobId(), apiaryv1.JobState_JOB_STATE_RUNNING)
		testutil.Eventually(t, 10*time.Second, "router sees eu-west fuller", func() error {
			eu, us := f.region(t, "eu-west"), f.region(t, "us-east")
			if eu.GetFree().GetCpuMillis() >= us.GetFree().GetCpuMillis() {
				return fmt.Errorf("free cpu eu %d us %d", eu.GetFree().GetCpuMillis(), us.GetFree().GetCpuMillis())
			}
			return nil
		})
		free := mustSubmit(t, f.global, spec(t, "name: any\ntasks: [{name: a, command: 'true'}]\n"))
		if free.GetRegion() != "us-east" {
			t.Errorf("unpinned job went to %s, want the emptier us-east", free.GetRegion())
		}
		for i := 0; i < 3; i++ {
			r := mustSubmit(t, f.global, spec(t, "name: eu\njurisdiction: eu\ndata_class: personal\ntasks: [{name: a, command: 'true'}]\n"))
			if r.GetRegion() != "eu-west" {
				t.Fatalf("eu job went to %s", r.GetRegion())
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := f.global.CancelJob(ctx, &apiaryv1.CancelJobRequest{JobId: fill.GetJobId()}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("refused everywhere with a reason per region; nothing stored", func(t *testing.T) {
		before := f.countJobs(t)
		dir := t.TempDir()
		files := map[string]string{
			"selector.yaml": "name: gold\nregion: {selector: {tier: gold}}\ntasks: [{name: a, command: 'true'}]\n",
			"nowhere.yaml":  "name: secret\njurisdiction: eu\ndata_class: restricted\ntasks: [{name: a, command: 'true'}]\n",
			"toolarge.yaml": "name: huge\ntasks: [{name: a, command: 'true', resources: {memory_mb: 65536}}]\n",
		}
		wantKind := map[string]string{"selector.yaml": "selector", "nowhere.yaml": "policy", "toolarge.yaml": "capacity"}
		for name, body := range files {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			out, code := f.cli(t, "job", "run", p)
			if code != 2 {
				t.Errorf("%s: exit %d, want 2:\n%s", name, code, out)
			}
			for _, r := range []string{"region eu-west: " + wantKind[name], "region us-east: " + wantKind[name]} {
				if !strings.Contains(out, r) {
					t.Errorf("%s: output lacks %q:\n%s", name, r, out)
				}
			}
			_, err := submit(f.global, spec(t, body))
			st := status.Convert(err)
			var pf *errdetails.PreconditionFailure
			for _, d := range st.Details() {
				if x, ok := d.(*errdetails.PreconditionFailure); ok {
					pf = x
				}
			}
			if st.Code() != codes.FailedPrecondition || pf == nil || len(pf.GetViolations()) != 2 {
				t.Errorf("%s: got %v with details %v; want FAILED_PRECONDITION with 2 violations", name, st.Code(), st.Details())
			}
		}
		if after := f.countJobs(t); after != before {
			t.Errorf("jobs stored: %d before, %d after refused submissions", before, after)
		}
		// The region refuses a task larger than any of its nodes by itself.
		if _, err := submit(f.usDirect, spec(t, files["toolarge.yaml"])); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "could never be placed") {
			t.Errorf("direct too-large submission: %v", err)
		}
	})

	t.Run("direct submission the policy forbids is refused by the region", func(t *testing.T) {
		_, err := submit(f.usDirect, spec(t, "name: eu\njurisdiction: eu\ndata_class: personal\ntasks: [{name: a, command: 'true'}]\n"))
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "eu-data-in-eu") {
			t.Fatalf("direct eu submission to us-east: %v; want FAILED_PRECONDITION naming rule eu-data-in-eu", err)
		}
		_, err = submit(f.euDirect, spec(t, "name: us\njurisdiction: us\ndata_class: personal\ntasks: [{name: a, command: 'true'}]\n"))
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("direct us personal submission to eu-west: %v", err)
		}
	})

	t.Run("every rule of deploy/policy.yaml: allowed jobs complete where the rule allows, forbidden ones are refused before anything is stored", func(t *testing.T) {
		type allowed struct {
			name, jur, class string
			via              apiaryv1.JobServiceClient
			regions          []string // where the rule lets it run
		}
		for _, c := range []allowed{
			{"eu-data-in-eu", "eu", "personal", f.global, []string{"eu-west"}},
			{"eu-data-in-eu, upper case", "EU", "Personal", f.global, []string{"eu-west"}},
			// CH data may run in CH or the EU: eu-west's EU nodes run it
			// (it used to wait forever: placement wanted node == job
			// jurisdiction).
			{"ch-data-in-ch-or-eu", "ch", "", f.global, []string{"eu-west"}},
			{"ch-data-in-ch-or-eu, direct", "ch", "internal", f.euDirect, []string{"eu-west"}},
			{"us-personal-in-us", "us", "personal", f.global, []string{"us-east"}},
			// Other US data may run anywhere, also on eu-west's nodes.
			{"default for us internal, direct to eu-west", "us", "internal", f.euDirect, []string{"eu-west"}},
			{"default for us internal", "us", "internal", f.global, []string{"eu-west", "us-east"}},
			{"default, no jurisdiction", "", "public", f.global, []string{"eu-west", "us-east"}},
		} {
			y := fmt.Sprintf("name: rule\njurisdiction: %q\ndata_class: %q\ntasks: [{name: a, command: 'true'}]\n", c.jur, c.class)
			r := mustSubmit(t, c.via, spec(t, y))
			if !slices.Contains(c.regions, r.GetRegion()) {
				t.Errorf("%s: accepted by %s, want one of %v", c.name, r.GetRegion(), c.regions)
			}
			waitState(t, f.global, r.GetJobId(), apiaryv1.JobState_JOB_STATE_COMPLETE)
		}
		before := f.countJobs(t)
		for _, c := range []struct {
			name, jur, class, rule string
			via                    apiaryv1.JobServiceClient
		}{
			{"restricted-nowhere", "eu", "restricted", "restricted-nowhere", f.global},
			{"restricted-nowhere, no jurisdiction", "", "restricted", "restricted-nowhere", f.global},
			{"restricted-nowhere, direct", "us", "restricted", "restricted-nowhere", f.usDirect},
			{"eu-data-in-eu, direct to us-east", "eu", "", "eu-data-in-eu", f.usDirect},
			{"ch-data-in-ch-or-eu, direct to us-east", "ch", "personal", "ch-data-in-ch-or-eu", f.usDirect},
			{"us-personal-in-us, direct to eu-west", "us", "personal", "us-personal-in-us", f.euDirect},
		} {
			y := fmt.Sprintf("name: rule\njurisdiction: %q\ndata_class: %q\ntasks: [{name: a, command: 'true'}]\n", c.jur, c.class)
			_, err := submit(c.via, spec(t, y))
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), c.rule) {
				t.Errorf("%s: %v; want FAILED_PRECONDITION naming rule %s", c.name, err, c.rule)
			}
		}
		// Values the policy does not know are refused, listing the known
		// ones, by the router and by a region alike.
		for _, c := range []struct {
			yaml, want string
			via        apiaryv1.JobServiceClient
		}{
			{"jurisdiction: xx\n", `jurisdiction: "xx" is not a jurisdiction of the sovereignty policy (known: ch, eu, us)`, f.global},
			{"jurisdiction: xx\n", `jurisdiction: "xx" is not a jurisdiction`, f.euDirect},
			{"jurisdiction: eu\ndata_class: persnal\n", `data_class: "persnal" is not a data class of the sovereignty policy (known: internal, personal, public, restricted)`, f.global},
			{"data_class: persnal\n", `data_class: "persnal"`, f.usDirect},
			{"region: {prefer: [us-eats]}\n", `region.prefer[0]: "us-eats" is not a region of the federation (known: eu-west, us-east)`, f.global},
		} {
			_, err := submit(c.via, spec(t, "name: typo\n"+c.yaml+"tasks: [{name: a, command: 'true'}]\n"))
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%q: %v; want INVALID_ARGUMENT containing %q", c.yaml, err, c.want)
			}
		}
		dir := t.TempDir()
		p := filepath.Join(dir, "typo.yaml")
		if err := os.WriteFile(p, []byte("name: typo\njurisdiction: eu\ndata_class: persnal\ntasks: [{name: a, command: 'true'}]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, code := f.cli(t, "job", "run", p); code != 2 || !strings.Contains(out, "known: internal, personal, public, restricted") {
			t.Errorf("job run with data_class typo: exit %d, want 2 listing the known classes:\n%s", code, out)
		}
		if after := f.countJobs(t); after != before {
			t.Errorf("jobs stored: %d before, %d after refused submissions", before, after)
		}
	})

	t.Run("get, cancel, logs route by job id; list merges regions", func(t *testing.T) {
		eu := mustSubmit(t, f.global, spec(t, "name: hello-eu\njurisdiction: eu\ntasks: [{name: a, command: echo, args: [hi-eu]}]\n"))
		us := mustSubmit(t, f.global, spec(t, "name: hello-us\njurisdiction: us\ntasks: [{name: a, command: echo, args: [hi-us]}]\n"))
		for _, r := range []*apiaryv1.SubmitJobResponse{eu, us} {
			waitState(t, f.global, r.GetJobId(), apiaryv1.JobState_JOB_STATE_COMPLETE)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			logs, err := f.global.GetJobLogs(ctx, &apiaryv1.GetJobLogsRequest{JobId: r.GetJobId(), TaskIndex: -1})
			cancel()
			if err != nil || !strings.Contains(logs.GetTasks()[0].GetAttempts()[0].GetStdoutTail(), "hi-") {
				t.Fatalf("logs of %s: %v %v", r.GetJobId(), logs, err)
			}
		}
		long := mustSubmit(t, f.global, spec(t, "name: long\njurisdiction: us\ntasks: [{name: a, command: sleep, args: ['30']}]\n"))
		waitState(t, f.global, long.GetJobId(), apiaryv1.JobState_JOB_STATE_RUNNING)
		if out, code := f.cli(t, "job", "cancel", long.GetJobId()); code != 0 {
			t.Fatalf("cancel via router: exit %d: %s", code, out)
		}
		waitState(t, f.global, long.GetJobId(), apiaryv1.JobState_JOB_STATE_CANCELLED)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		list, err := f.global.ListJobs(ctx, &apiaryv1.ListJobsRequest{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		regions := map[string]int{}
		for _, j := range list.GetJobs() {
			regions[j.GetRegion()]++
		}
		if regions["eu-west"] == 0 || regions["us-east"] == 0 || len(list.GetUnavailableRegions()) != 0 {
			t.Fatalf("list: %v, unavailable %v", regions, list.GetUnavailableRegions())
		}
		if out, code := f.cli(t, "job", "status", eu.GetJobId()); code != 0 || !strings.Contains(out, "eu-west") {
			t.Fatalf("status via router: exit %d: %s", code, out)
		}
	})

	t.Run("backlog bound: 51st job refused by the region, router places it elsewhere", func(t *testing.T) {
		stuck := spec(t, "name: stuck\ntasks: [{name: a, command: 'true', constraints: [{label: never, op: exists}]}]\n")
		// Jobs accepted since the region's last read count as pending until
		// the next read (at most federation.SummaryRefresh): let earlier ones settle.
		t0 := time.Now().UnixMilli()
		testutil.Eventually(t, 10*time.Second, "us-east backlog settled at 0", func() error {
			r := f.region(t, "us-east")
			for _, b := range r.GetBacklog() {
				if b.GetClass() == "standard" && b.GetPending() == 0 && r.GetUpdatedTimeMs() > t0+int64(federation.SummaryRefresh/time.Millisecond) {
					return nil
				}
			}
			return fmt.Errorf("backlog %v at %d", r.GetBacklog(), r.GetUpdatedTimeMs())
		})
		var ids []string
		for i := 0; i < 50; i++ {
			r, err := submit(f.usDirect, stuck)
			if err != nil {
				t.Fatalf("stuck job %d: %v", i, err)
			}
			ids = append(ids, r.GetJobId())
		}
		_, err := submit(f.usDirect, stuck)
		st := status.Convert(err)
		if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "bound of 50") {
			t.Fatalf("51st direct submission: %v; want RESOURCE_EXHAUSTED at the bound", err)
		}
		hasRetry := false
		for _, d := range st.Details() {
			_, ok := d.(*errdetails.RetryInfo)
			hasRetry = hasRetry || ok
		}
		if !hasRetry {
			t.Errorf("no RetryInfo detail on %v", st.Details())
		}
		r := mustSubmit(t, f.global, spec(t, "name: overflow\nregion: {prefer: [us-east]}\ntasks: [{name: a, command: 'true'}]\n"))
		if r.GetRegion() != "eu-west" {
			t.Fatalf("overflow job went to %s, want eu-west", r.GetRegion())
		}
		testutil.Eventually(t, 10*time.Second, "region list shows backlog", func() error {
			for _, b := range f.region(t, "us-east").GetBacklog() {
				if b.GetClass() == "standard" && b.GetPending() >= 50 && b.GetBound() == 50 {
					return nil
				}
			}
			return fmt.Errorf("backlog %v", f.region(t, "us-east").GetBacklog())
		})
		for _, id := range ids {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := f.global.CancelJob(ctx, &apiaryv1.CancelJobRequest{JobId: id})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("us-east loses every coordinator, then comes back", func(t *testing.T) {
		probeID := ids.NewJobID("us-east", time.Now()) // no such job: us-east says NotFound while up
		killed := time.Now()
		if err := f.us.Coords[0].Kill(); err != nil {
			t.Fatal(err)
		}
		// A request the router writes on its pooled connection to us-east
		// before it notices the connection died ends with "error reading
		// from server: EOF": an unknown outcome, which a submission must not
		// reroute (it may have been accepted). Wait until a read through the
		// router finds us-east gone, so the router's transport knows.
		testutil.Eventually(t, 10*time.Second, "router sees us-east's connection closed", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if _, err := f.global.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: probeID}); status.Code(err) == codes.NotFound {
				return fmt.Errorf("us-east still answers")
			}
			return nil
		})
		// New unpinned submissions never see an error: they go to eu-west.
		var firstEU time.Duration
		for i := 0; i < 10; i++ {
			r := mustSubmit(t, f.global, spec(t, "name: after-kill\nregion: {prefer: [us-east]}\ntasks: [{name: a, command: 'true'}]\n"))
			if r.GetRegion() == "eu-west" && firstEU == 0 {
				firstEU = time.Since(killed)
			}
			if r.GetRegion() != "eu-west" {
				t.Fatalf("submission %d after the kill went to %s", i, r.GetRegion())
			}
		}
		t.Logf("first submission routed to eu-west %s after SIGKILL of us-east's last coordinator", firstEU)
		_, err := submit(f.global, spec(t, "name: us\njurisdiction: us\ndata_class: personal\ntasks: [{name: a, command: 'true'}]\n"))
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "no eligible region up") {
			t.Fatalf("us-pinned job with us-east down: %v", err)
		}
		testutil.Eventually(t, 10*time.Second, "region list shows us-east down", func() error {
			if r := f.region(t, "us-east"); r.GetUp() {
				return fmt.Errorf("us-east still up: %v", r)
			}
			return nil
		})
		out, code := f.cli(t, "region", "list")
		if code != 0 || !strings.Contains(out, "DOWN") {
			t.Fatalf("region list: exit %d:\n%s", code, out)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := f.us.RestartCoordinator(ctx, 0); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 30*time.Second, "us-east back up", func() error {
			if r := f.region(t, "us-east"); !r.GetUp() {
				return fmt.Errorf("us-east: %s", r.GetDownReason())
			}
			return nil
		})
		r := mustSubmit(t, f.global, spec(t, "name: us\njurisdiction: us\ndata_class: personal\ntasks: [{name: a, command: 'true'}]\n"))
		if r.GetRegion() != "us-east" {
			t.Fatalf("us job after restart went to %s", r.GetRegion())
		}
	})
}

// TestDevReadyFileHello: `apiary dev --ready-file` then `apiary job run
// examples/hello.yaml --wait` through the global router exits 0, and SIGTERM
// stops every process.
func TestDevReadyFileHello(t *testing.T) {
	bin := testutil.Binary(t)
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready.json")
	dev := exec.Command(bin, "dev", "--ready-file", ready, "--data-dir", filepath.Join(dir, "data"), "--agents-per-region", "1")
	var log bytes.Buffer
	dev.Stdout, dev.Stderr = &log, &log
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- dev.Wait() }()
	defer func() {
		_ = dev.Process.Kill()
	}()
	testutil.Eventually(t, 90*time.Second, "ready file", func() error {
		select {
		case err := <-exited:
			t.Fatalf("apiary dev exited: %v\n%s", err, log.String())
		default:
		}
		_, err := os.Stat(ready)
		return err
	})
	b, _ := os.ReadFile(ready)
	var addr string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"global_addr"`) {
			addr = strings.Trim(strings.TrimSpace(strings.SplitN(line, ":", 2)[1]), `",`)
		}
	}
	if addr == "" {
		t.Fatalf("no global_addr in %s", b)
	}
	run := exec.Command(bin, "job", "run", "../../examples/hello.yaml", "--wait", "--addr", addr)
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("job run: %v\n%s", err, out)
	}
	_ = dev.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("apiary dev did not stop within 30 s of SIGINT")
	}
	if left := processesMentioning(t, dir); len(left) > 0 {
		t.Fatalf("processes left behind: %v", left)
	}
	// apiary dev traces every process into one file: the job's lifecycle,
	// from the router's route decision to the agent's run, is one trace.
	id := regexp.MustCompile(`(eu-west|us-east)-[0-9a-z]{20}`).FindString(string(out))
	spans, err := telemetry.ReadSpanFile(filepath.Join(dir, "data", "traces.jsonl"))
	if err != nil || id == "" {
		t.Fatalf("job %q, spans: %v", id, err)
	}
	trace := ""
	for _, sp := range spans {
		if sp.Name == telemetry.SpanAccept && sp.Attr(telemetry.AttrJobID) == id {
			trace = sp.TraceID
		}
	}
	names := map[string]bool{}
	for _, sp := range spans {
		if sp.TraceID == trace {
			names[sp.Name] = true
		}
	}
	for _, want := range []string{telemetry.SpanRoute, telemetry.SpanAccept, telemetry.SpanPlace, telemetry.SpanDispatch, telemetry.SpanRun, "task.complete"} {
		if trace == "" || !names[want] {
			t.Fatalf("job %s trace %q lacks %s; has %v", id, trace, want, names)
		}
	}
}

// processesMentioning lists the pids whose command line contains s (a scan
// of /proc, so it cannot silently pass for want of a tool).
func processesMentioning(t *testing.T, s string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}
