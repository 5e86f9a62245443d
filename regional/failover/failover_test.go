package failover_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/regional/store"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

// fed is a router and four regions, each one coordinator and one agent:
// eu-west (the home), eu-central and eu-north (EU standbys), us-east; with
// mutual TLS and ACLs on, so that the regions' calls to each other pass the
// certificate gate and the ACL layer as in production.
type fed struct {
	cl     *devcluster.Cluster
	router apiaryv1.JobServiceClient
	direct map[string]apiaryv1.JobServiceClient
	region map[string]*devcluster.Region
}

func startFed(t *testing.T) *fed {
	t.Helper()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(sovereignty.DefaultYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	region := func(name, jur string) devcluster.RegionSpec {
		return devcluster.RegionSpec{Name: name, Jurisdiction: jur, Labels: map[string]string{"jurisdiction": jur},
			Agents:    []devcluster.AgentSpec{{ID: name + "-n1", CPUMillis: 4000, MemoryMiB: 4096}},
			ExtraArgs: []string{"--node-lease-ttl", "2s"}, NoLAN: true}
	}
	opts := devcluster.Options{Binary: testutil.Binary(t), Dir: dir, Global: &devcluster.GlobalSpec{PolicyFile: pol}, TLS: true, ACL: true,
		Regions: []devcluster.RegionSpec{region("eu-west", "eu"), region("eu-central", "eu"), region("eu-north", "eu"), region("us-east", "us")}}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, err := devcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	f := &fed{cl: cl, direct: map[string]apiaryv1.JobServiceClient{}, region: map[string]*devcluster.Region{}}
	var conns []*grpc.ClientConn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
		cl.Stop()
		if t.Failed() {
			for _, r := range cl.Regions {
				for _, p := range append(r.Coords, r.Agents...) {
					b, _ := os.ReadFile(p.LogPath)
					if len(b) > 4000 {
						b = b[len(b)-4000:]
					}
					t.Logf("--- %s log tail ---\n%s", p.Name, b)
				}
			}
		}
	})
	keep := func(c *grpc.ClientConn, err error) apiaryv1.JobServiceClient {
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		return apiaryv1.NewJobServiceClient(c)
	}
	f.router = keep(cl.Dial(cl.GlobalAddr))
	for _, r := range cl.Regions {
		f.direct[r.Spec.Name] = keep(r.Dial())
		f.region[r.Spec.Name] = r
	}
	return f
}

func parse(t *testing.T, y string) *apiaryv1.JobSpec {
	t.Helper()
	s, err := jobspec.Parse([]byte(y))
	if err == nil {
		err = jobspec.Validate(s)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (f *fed) submit(t *testing.T, spec *apiaryv1.JobSpec) *apiaryv1.SubmitJobResponse {
	t.Helper()
	return f.submitVia(t, f.router, spec)
}

func (f *fed) submitVia(t *testing.T, c apiaryv1.JobServiceClient, spec *apiaryv1.JobSpec) *apiaryv1.SubmitJobResponse {
	t.Helper()
	req := &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: "fotest", RequestId: fmt.Sprintf("r-%d", time.Now().UnixNano()),
		EphemeralRequestId: true} // routed by prefer and load, not pinned to a home by its key
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := c.SubmitJob(ctx, req, grpc.WaitForReady(true))
		cancel()
		if err == nil {
			return resp
		}
		// The same request id: a retry never makes a second job.
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("submit %s: %v", spec.GetName(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func get(c apiaryv1.JobServiceClient, id string) (*apiaryv1.Job, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: id})
	return resp.GetJob(), err
}

// waitJob polls region's view of job id until cond holds (limit: d).
func (f *fed) waitJob(t *testing.T, region, id string, d time.Duration, what string, cond func(*apiaryv1.Job) bool) *apiaryv1.Job {
	t.Helper()
	deadline := time.Now().Add(d)
	var last *apiaryv1.Job
	var lastErr error
	for time.Now().Before(deadline) {
		j, err := get(f.direct[region], id)
		if err == nil && cond(j) {
			return j
		}
		last, lastErr = j, err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: job %s in %s: not %s within %s; last %v (err %v)", t.Name(), id, region, what, d, last, lastErr)
	return nil
}

// activeStandby is the EU standby that holds job id (activated it) within
// limit, or "".
func (f *fed) activeStandby(id string, limit time.Duration) string {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		for _, s := range []string{"eu-central", "eu-north"} {
			if _, err := get(f.direct[s], id); err == nil {
				return s
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return ""
}

// startWave submits, through the router, a job of three tasks of secs
// seconds each that run one at a time at eu-west (4,000 millicores, 3,000
// each), standing by in eu-central then eu-north (after: 4s), and waits
// for its first task to run. It returns the job id.
func (f *fed) startWave(t *testing.T, name string, secs int) string {
	t.Helper()
	r := f.submit(t, parse(t, fmt.Sprintf(`
name: %s
jurisdiction: eu
region: {prefer: [eu-west]}
failover: {after: 4s, regions: [eu-central, eu-north]}
tasks:
  - {name: wave, count: 3, command: /bin/sleep, args: ["%d"], resources: {cpu_millis: 3000}}
`, name, secs)))
	if r.GetRegion() != "eu-west" {
		t.Fatalf("routed to %s; want eu-west", r.GetRegion())
	}
	f.waitJob(t, "eu-west", r.GetJobId(), 20*time.Second, "a task running", func(j *apiaryv1.Job) bool {
		return j.GetCounts().GetRunning() > 0 && strings.Join(j.GetFailover().GetStandbys(), ",") == "eu-central,eu-north"
	})
	return r.GetJobId()
}

// etcd is a client of region's etcd (as its coordinators reach it), for
// reading and planting failover records.
func (f *fed) etcd(t *testing.T, region string) *clientv3.Client {
	t.Helper()
	cli, err := f.cl.EtcdClient(f.region[region])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// waitKeys polls cli until cond holds for the keys under prefix (limit d).
func waitKeys(t *testing.T, cli *clientv3.Client, prefix string, d time.Duration, what string, cond func(keys []string) bool) {
	t.Helper()
	testutil.Eventually(t, d, "keys under "+prefix+": "+what, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return err
		}
		var keys []string
		for _, kv := range resp.Kvs {
			keys = append(keys, string(kv.Key))
		}
		if !cond(keys) {
			return fmt.Errorf("keys %v", keys)
		}
		return nil
	})
}

func killRegion(t *testing.T, r *devcluster.Region) {
	t.Helper()
	for _, p := range r.Coords {
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
	}
}

func restartRegion(t *testing.T, r *devcluster.Region) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := r.RestartCoordinators(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFailoverOfAcceptedJobs runs the cases on one federation, in
// order: a job whose policy allows no other region; the home back before
// after (nothing moves); the home lost past after (the job completes in
// exactly one EU standby, never in us-east, the replicated completion not
// rerun, every new token above the home's); the home back (the job MOVED
// there, its late completions discarded, nothing of it running).
func TestFailoverOfAcceptedJobs(t *testing.T) {
	f := startFed(t)
	euWest := f.region["eu-west"]

	t.Run("no eligible standby", func(t *testing.T) {
		r := f.submit(t, parse(t, `
name: us-personal
jurisdiction: us
data_class: personal
failover: {after: 5s}
tasks: [{name: t, command: /bin/true}]
`))
		j, err := get(f.router, r.GetJobId())
		if err != nil {
			t.Fatal(err)
		}
		fo := j.GetFailover()
		if r.GetRegion() != "us-east" || len(fo.GetStandbys()) != 0 || !strings.Contains(fo.GetNotEligible(), "eu-central: policy") ||
			!strings.Contains(fo.GetNotEligible(), "us-personal-in-us") {
			t.Fatalf("job in %s, failover %v; want us-east, no standby, a reason naming the policy rule", r.GetRegion(), fo)
		}
	})

	spec := func(name, after string, long ...bool) *apiaryv1.JobSpec {
		extra := ""
		if len(long) > 0 {
			// Runs for a minute in eu-west, a second anywhere else: on the
			// home's return its attempt is still running there and must
			// be killed.
			extra = `  - {name: long, command: /bin/sh, args: ["-c", "if [ \"$APIARY_REGION\" = eu-west ]; then sleep 60; else sleep 1; fi"]}` + "\n"
		}
		return parse(t, fmt.Sprintf(`
name: %s
jurisdiction: eu
region: {prefer: [eu-west]}
failover: {after: %s, regions: [eu-central, eu-north]}
tasks:
  - {name: quick, command: /bin/true}
  - {name: slow, count: 3, command: /bin/sleep, args: ["4"]}
%s`, name, after, extra))
	}

	t.Run("home back before after", func(t *testing.T) {
		r := f.submit(t, spec("back-soon", "60s"))
		if r.GetRegion() != "eu-west" {
			t.Fatalf("routed to %s; want eu-west", r.GetRegion())
		}
		j, _ := get(f.direct["eu-west"], r.GetJobId())
		if got := j.GetFailover().GetStandbys(); strings.Join(got, ",") != "eu-central,eu-north" {
			t.Fatalf("standbys %v; want [eu-central eu-north]", got)
		}
		killRegion(t, euWest)
		time.Sleep(2 * time.Second) // a short outage, well under after
		restartRegion(t, euWest)
		f.waitJob(t, "eu-west", r.GetJobId(), 40*time.Second, "COMPLETE", func(j *apiaryv1.Job) bool {
			return j.GetState() == apiaryv1.JobState_JOB_STATE_COMPLETE
		})
		for _, s := range []string{"eu-central", "eu-north"} {
			if _, err := get(f.direct[s], r.GetJobId()); status.Code(err) != codes.NotFound {
				t.Errorf("%s has the job (%v); want NotFound: nothing moves when the home is back before after", s, err)
			}
		}
	})

	t.Run("a lost standby does not stall the home", func(t *testing.T) {
		// The job names eu-central and eu-north; eu-north is lost with
		// the job in flight. The home keeps dispatching it on
		// eu-central's answers alone (eu-north could activate it only
		// with eu-central's grant), well past after/2 (2 s).
		id := f.startWave(t, "one-standby-lost", 2)
		// A job whose only standby is eu-north: held once eu-north is
		// lost (it may be taking the job over), which its status says;
		// cancelled, its attempt ends and frees the node at once.
		only := f.submit(t, parse(t, `
name: only-north
jurisdiction: eu
region: {prefer: [eu-west]}
failover: {after: 4s, regions: [eu-north]}
tasks: [{name: long, command: /bin/sleep, args: ["60"], resources: {cpu_millis: 500}}]
`)).GetJobId()
		f.waitJob(t, "eu-west", only, 20*time.Second, "running", func(j *apiaryv1.Job) bool { return j.GetCounts().GetRunning() == 1 })
		north := f.region["eu-north"]
		killRegion(t, north)
		killedAt := time.Now()
		// One task at a time fits the agent (4,000 millicores): the
		// third starts about 4 s after the kill.
		j := f.waitJob(t, "eu-west", id, 40*time.Second, "COMPLETE at home", func(j *apiaryv1.Job) bool {
			return j.GetState() == apiaryv1.JobState_JOB_STATE_COMPLETE
		})
		last := int64(0)
		for _, tk := range j.GetTasks() {
			if tk.GetAttempt() != 1 {
				t.Errorf("task %d ran %d attempts; want 1", tk.GetIndex(), tk.GetAttempt())
			}
			for _, a := range tk.GetAttempts() {
				last = max(last, a.GetStartTimeMs())
			}
		}
		if late := time.Duration(last-killedAt.UnixMilli()) * time.Millisecond; late < 2*time.Second {
			t.Errorf("the last task started %v after eu-north's loss; want past after/2 (2 s), to show the home was not held", late)
		}
		if _, err := get(f.direct["eu-central"], id); status.Code(err) != codes.NotFound {
			t.Errorf("eu-central has the job (%v); want NotFound: its home never went down", err)
		}
		held := f.waitJob(t, "eu-west", only, 20*time.Second, "held", func(j *apiaryv1.Job) bool { return j.GetFailover().GetHeld() != "" })
		if h := held.GetFailover().GetHeld(); !strings.Contains(h, "eu-north") {
			t.Errorf("held: %q; want the reason to name eu-north", h)
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := f.direct["eu-west"].CancelJob(cctx, &apiaryv1.CancelJobRequest{JobId: only})
		ccancel()
		if err != nil {
			t.Fatal(err)
		}
		f.waitJob(t, "eu-west", only, 20*time.Second, "CANCELLED, its attempt ended", func(j *apiaryv1.Job) bool {
			return j.GetState() == apiaryv1.JobState_JOB_STATE_CANCELLED && j.GetCounts().GetRunning()+j.GetCounts().GetAssigned() == 0
		})
		restartRegion(t, north)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := f.cl.WaitGlobal(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("home lost then back", func(t *testing.T) {
		r := f.submit(t, spec("moves", "5s", true))
		id := r.GetJobId()
		home := f.waitJob(t, "eu-west", id, 20*time.Second, "running with task 0 complete", func(j *apiaryv1.Job) bool {
			return len(j.GetTasks()) == 5 && j.GetTasks()[0].GetState() == apiaryv1.TaskState_TASK_STATE_COMPLETE &&
				j.GetCounts().GetRunning() > 0
		})
		homeToken := int64(0)
		for _, tk := range home.GetTasks() {
			homeToken = max(homeToken, tk.GetFencingToken())
		}
		// Give the progress loop a moment to push task 0 (it batches
		// every 200 ms); the standby's record is checked below.
		time.Sleep(time.Second)
		killRegion(t, euWest)
		killedAt := time.Now()

		active := f.activeStandby(id, 40*time.Second)
		if active == "" {
			t.Fatal("no standby activated the job within 40 s of the home's loss")
		}
		t.Logf("activated in %s %.1f s after the kill (after: 5s)", active, time.Since(killedAt).Seconds())
		if active != "eu-central" {
			t.Errorf("activated in %s; want eu-central, the first standby of failover.regions (the second waits 2 s more)", active)
		}
		j := f.waitJob(t, active, id, 40*time.Second, "COMPLETE", func(j *apiaryv1.Job) bool {
			return j.GetState() == apiaryv1.JobState_JOB_STATE_COMPLETE
		})
		if fo := j.GetFailover(); fo.GetEpoch() != 1 || fo.GetHomeRegion() != "eu-west" || fo.GetActiveRegion() != active {
			t.Errorf("failover status %v; want epoch 1, home eu-west, active %s", fo, active)
		}
		// The router follows the job while its home is down.
		if rj, err := get(f.router, id); err != nil || rj.GetFailover().GetActiveRegion() != active || rj.GetState() != apiaryv1.JobState_JOB_STATE_COMPLETE {
			t.Errorf("router GetJob with the home down: %v (err %v); want the job as %s has it", rj.GetState(), err, active)
		}
		if t0 := j.GetTasks()[0]; t0.GetFencingToken() != home.GetTasks()[0].GetFencingToken() || t0.GetFencingToken() >= 1<<store.FailoverTokenShift {
			t.Errorf("task 0 token %d; want the home's %d: its replicated completion is not rerun", t0.GetFencingToken(), home.GetTasks()[0].GetFencingToken())
		}
		for _, tk := range j.GetTasks()[1:] {
			if tk.GetFencingToken() <= homeToken || tk.GetFencingToken() < 1<<store.FailoverTokenShift {
				t.Errorf("task %d token %d; want above every home token (max %d) and at least 1<<48", tk.GetIndex(), tk.GetFencingToken(), homeToken)
			}
		}
		other := "eu-north"
		if active == "eu-north" {
			other = "eu-central"
		}
		if _, err := get(f.direct[other], id); status.Code(err) != codes.NotFound {
			t.Errorf("%s has the job too (%v): exactly one standby may activate it", other, err)
		}
		if _, err := get(f.direct["us-east"], id); status.Code(err) != codes.NotFound {
			t.Errorf("us-east has the EU job (%v)", err)
		}

		restartRegion(t, euWest)
		// A job the home takes at once, before the standbys see it up
		// again, stays there: the home wrote its standby record, alive.
		fresh := f.submitVia(t, f.direct["eu-west"], spec("after-return", "5s"))
		back := f.waitJob(t, "eu-west", id, 30*time.Second, "MOVED with nothing active", func(j *apiaryv1.Job) bool {
			c := j.GetCounts()
			return j.GetState() == apiaryv1.JobState_JOB_STATE_MOVED && c.GetAssigned()+c.GetRunning()+c.GetPending() == 0
		})
		if fo := back.GetFailover(); fo.GetActiveRegion() != active || fo.GetEpoch() != 1 {
			t.Errorf("home's failover status %v; want active %s, epoch 1", fo, active)
		}
		f.waitJob(t, "eu-west", fresh.GetJobId(), 40*time.Second, "COMPLETE at home", func(j *apiaryv1.Job) bool {
			return j.GetState() == apiaryv1.JobState_JOB_STATE_COMPLETE
		})
		for _, s := range []string{"eu-central", "eu-north"} {
			if _, err := get(f.direct[s], fresh.GetJobId()); status.Code(err) != codes.NotFound {
				t.Errorf("%s activated a job eu-west took after its return (%v)", s, err)
			}
		}
		// Through the router, the job is where it runs now.
		if rj, err := get(f.router, id); err != nil || rj.GetState() != apiaryv1.JobState_JOB_STATE_COMPLETE || rj.GetRegion() != active {
			t.Errorf("router GetJob after the home's return: %v in %s (err %v); want COMPLETE in %s", rj.GetState(), rj.GetRegion(), err, active)
		}
		for _, tk := range back.GetTasks()[1:] {
			if tk.GetState() == apiaryv1.TaskState_TASK_STATE_COMPLETE {
				t.Errorf("home task %d COMPLETE after the move: its late completion must be discarded", tk.GetIndex())
			}
		}
		// The long task was still running on eu-west's agent: killed, in
		// far less than its 60 s.
		if long := back.GetTasks()[4]; long.GetState() != apiaryv1.TaskState_TASK_STATE_CANCELLED || len(long.GetAttempts()) == 0 ||
			long.GetAttempts()[len(long.GetAttempts())-1].GetEndTimeMs()-long.GetAttempts()[len(long.GetAttempts())-1].GetStartTimeMs() > 50_000 {
			t.Errorf("home's long task: %v, attempts %v; want CANCELLED, its attempt killed well before its 60 s", long.GetState(), long.GetAttempts())
		}
	})

	t.Run("home paused past after holds the moved job", func(t *testing.T) {
		// The breaker's case: the home's coordinator is paused (not
		// killed) past after, its standby takes the job over and is then
		// paused itself; the home, resumed, must not dispatch the job
		// again before a standby tells it the job moved.
		r := f.submit(t, spec("paused", "4s", true))
		id := r.GetJobId()
		f.waitJob(t, "eu-west", id, 20*time.Second, "running", func(j *apiaryv1.Job) bool { return j.GetCounts().GetRunning() > 0 })
		home := euWest.Coords[0]
		before, err := get(f.direct["eu-west"], id)
		if err != nil {
			t.Fatal(err)
		}
		if err := home.Pause(); err != nil {
			t.Fatal(err)
		}
		active := f.activeStandby(id, 30*time.Second)
		if active == "" {
			home.Resume()
			t.Fatal("no standby activated the job of a paused home")
		}
		standby := f.region[active].Coords[0]
		if err := standby.Pause(); err != nil {
			t.Fatal(err)
		}
		defer standby.Resume()
		resumed := time.Now()
		if err := home.Resume(); err != nil {
			t.Fatal(err)
		}
		// Past a lease and a few scheduling rounds: nothing of the job
		// starts at home.
		time.Sleep(4 * time.Second)
		j, err := get(f.direct["eu-west"], id)
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range j.GetTasks() {
			for _, a := range tk.GetAttempts() {
				if a.GetStartTimeMs() > resumed.UnixMilli() {
					t.Errorf("task %d attempt %d started at home %d ms after its resume, while %s (paused) holds the job",
						tk.GetIndex(), a.GetAttempt(), a.GetStartTimeMs()-resumed.UnixMilli(), active)
				}
			}
			// A dispatch commits a new attempt; one that never started
			// (the agent may be slow to spawn it) still counts.
			if was := before.GetTasks()[tk.GetIndex()].GetAttempt(); tk.GetAttempt() > was {
				t.Errorf("task %d dispatched again at home (attempt %d, was %d) while %s holds the job", tk.GetIndex(), tk.GetAttempt(), was, active)
			}
		}
		if err := standby.Resume(); err != nil {
			t.Fatal(err)
		}
		f.waitJob(t, "eu-west", id, 30*time.Second, "MOVED", func(j *apiaryv1.Job) bool {
			return j.GetState() == apiaryv1.JobState_JOB_STATE_MOVED && j.GetFailover().GetActiveRegion() == active
		})
	})

	t.Run("a claim left behind is released when the home is back", func(t *testing.T) {
		// eu-north claimed the job from eu-central (the grant dropped
		// eu-central's record and left a claim), then died before
		// activating it, or never heard the grant. The home, up all
		// along, holds the job while the claim stands; it must end the
		// claim and run the job, not hold it forever.
		id := f.startWave(t, "claim-left-behind", 3)
		central, north := f.etcd(t, "eu-central"), f.etcd(t, "eu-north")
		waitKeys(t, central, store.KeyStandby(id), 10*time.Second, "the standby record", func(k []string) bool { return len(k) == 1 })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// The grant, as ClaimJob commits it at eu-central.
		if _, err := central.Txn(ctx).Then(clientv3.OpDelete(store.KeyStandby(id)), clientv3.OpDelete(store.PrefStandbyTasks(id), clientv3.WithPrefix()),
			clientv3.OpPut(store.KeyClaimed(id), store.MustJSON(store.ClaimRecord{By: "eu-north", AtMs: time.Now().UnixMilli()}))).Commit(); err != nil {
			t.Fatal(err)
		}
		// Released: the claim goes, both standbys hold the record again.
		waitKeys(t, central, store.PrefFailover, 10*time.Second, "claim dropped and record written again", func(k []string) bool {
			return !slices.Contains(k, store.KeyClaimed(id)) && slices.Contains(k, store.KeyStandby(id))
		})
		waitKeys(t, north, store.KeyStandby(id), 10*time.Second, "the claimer's record written again", func(k []string) bool { return len(k) == 1 })
		j := f.waitJob(t, "eu-west", id, 40*time.Second, "COMPLETE at home", func(j *apiaryv1.Job) bool {
			return j.GetState() == apiaryv1.JobState_JOB_STATE_COMPLETE
		})
		for _, tk := range j.GetTasks() {
			if tk.GetAttempt() != 1 {
				t.Errorf("task %d ran %d attempts; want 1", tk.GetIndex(), tk.GetAttempt())
			}
		}
		for _, s := range []string{"eu-central", "eu-north"} {
			if _, err := get(f.direct[s], id); status.Code(err) != codes.NotFound {
				t.Errorf("%s has the job (%v); want NotFound: its home never went down", s, err)
			}
		}
		// The job's end reaches both standbys: no record outlives it.
		for _, c := range []*clientv3.Client{central, north} {
			waitKeys(t, c, store.KeyStandby(id), 10*time.Second, "dropped at the job's end", func(k []string) bool { return len(k) == 0 })
		}
	})

	t.Run("standby records of a submission that never committed are dropped", func(t *testing.T) {
		// Two cases of the kind. (1) Concurrent repeats of one request:
		// every loser wrote standby records and never committed. (2) A
		// coordinator that died between its standby writes and its
		// commit, planted: a pending record at home and the standbys'
		// records; the home's failover leader must abandon it after the
		// grace and have both standbys drop their records.
		spec := parse(t, `
name: repeated
jurisdiction: eu
region: {prefer: [eu-west]}
failover: {after: 4s, regions: [eu-central, eu-north]}
tasks: [{name: t, command: /bin/sleep, args: ["1"]}]
`)
		req := &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: "fotest", RequestId: fmt.Sprintf("race-%d", time.Now().UnixNano())}
		var wg sync.WaitGroup
		got := make([]string, 6)
		for i := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// An attempt that a later one superseded answers
				// UNAVAILABLE; a client retries with the same request id.
				deadline := time.Now().Add(20 * time.Second)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					resp, err := f.direct["eu-west"].SubmitJob(ctx, req)
					cancel()
					if err == nil {
						got[i] = resp.GetJobId()
						return
					}
					if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
						t.Errorf("repeat %d: %v", i, err)
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		winner := got[0]
		for _, g := range got {
			if g != winner {
				t.Fatalf("repeats answered %v; want one job", got)
			}
		}
		f.waitJob(t, "eu-west", winner, 30*time.Second, "COMPLETE", func(j *apiaryv1.Job) bool {
			return j.GetState() == apiaryv1.JobState_JOB_STATE_COMPLETE
		})
		home, central, north := f.etcd(t, "eu-west"), f.etcd(t, "eu-central"), f.etcd(t, "eu-north")

		// (2) planted: a coordinator died after its standby writes, twice:
		// once for a request nobody retries (pending since well before the
		// grace: the leader abandons it), once for a request whose client
		// retries at once (pending just now: the retry supersedes it,
		// long before the grace, and its own job runs).
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		retried := &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: "fotest", RequestId: fmt.Sprintf("retried-%d", time.Now().UnixNano())}
		prepared, err := jobspec.Prepare(spec) // as the home and a standby hash it
		if err != nil {
			t.Fatal(err)
		}
		plant := func(created time.Time, req *apiaryv1.SubmitJobRequest) string {
			t.Helper()
			orphan := ids.NewJobID("eu-west", time.Now())
			sr := store.StandbyRecord{ID: orphan, Home: "eu-west", Spec: spec, AfterMs: 4000, Standbys: []string{"eu-central", "eu-north"},
				StoredMs: time.Now().UnixMilli(), SubmitMs: time.Now().UnixMilli(), ClientID: req.GetClientId(), RequestID: req.GetRequestId()}
			for _, c := range []*clientv3.Client{central, north} {
				if _, err := c.Put(ctx, store.KeyStandby(orphan), store.MustJSON(sr)); err != nil {
					t.Fatal(err)
				}
				if req.GetRequestId() == "" {
					continue
				}
				// The standbys' dedup key of the request, as PutStandby
				// writes it: it must not answer the retry with a job
				// that never committed (the retry goes to the home).
				if _, err := c.Put(ctx, store.KeyDedup(req.GetClientId(), req.GetRequestId()),
					store.MustJSON(store.DedupRecord{JobID: orphan, Hash: jobspec.PayloadHash(prepared), Standby: true})); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := home.Put(ctx, store.KeyFailoverPending(orphan), store.MustJSON(store.PendingRecord{Standbys: sr.Standbys,
				CreatedMs: created.UnixMilli(), ClientID: req.GetClientId(), RequestID: req.GetRequestId()})); err != nil {
				t.Fatal(err)
			}
			return orphan
		}
		stale := plant(time.Now().Add(-time.Minute), &apiaryv1.SubmitJobRequest{})
		fresh := plant(time.Now(), retried)
		// Through the router, which asks the other regions first: the
		// standbys send it on to the home, which makes the job.
		w, err := f.router.SubmitJob(ctx, retried)
		if err != nil || w.GetJobId() == fresh || w.GetRegion() != "eu-west" {
			t.Fatalf("the retry: %v (err %v); want a new job in eu-west, not the attempt that never committed (%s)", w, err, fresh)
		}
		for name, c := range map[string]*clientv3.Client{"eu-central": central, "eu-north": north} {
			waitKeys(t, c, store.KeyEnded(fresh), 5*time.Second, "a tombstone of the superseded attempt at "+name, func(k []string) bool { return len(k) == 1 })
		}
		f.waitJob(t, "eu-west", w.GetJobId(), 30*time.Second, "COMPLETE", func(j *apiaryv1.Job) bool {
			return j.GetState() == apiaryv1.JobState_JOB_STATE_COMPLETE
		})
		// Neither standby keeps a record of eu-west's once all is done:
		// not the losers', not the planted ones, not the winners' (they
		// ended); every pending record at home is gone.
		for name, c := range map[string]*clientv3.Client{"eu-central": central, "eu-north": north} {
			waitKeys(t, c, store.PrefStandby+"eu-west-", 20*time.Second, "empty at "+name, func(k []string) bool { return len(k) == 0 })
			waitKeys(t, c, store.KeyEnded(stale), 5*time.Second, "a tombstone of the abandoned job at "+name, func(k []string) bool { return len(k) == 1 })
		}
		waitKeys(t, home, store.PrefFailoverPending, 10*time.Second, "no pending record", func(k []string) bool { return len(k) == 0 })
	})
}
