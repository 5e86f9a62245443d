package router_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/global/router"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/internal/testutil"
)

// TestIdempotencyAcrossRouters: the same (client id, request id) through two
// router replicas yields one job, also when the request's home region
// refuses it (forwarded, once) and when the home region is killed between
// the two submissions (outcome unknown, never a second job).
func TestIdempotencyAcrossRouters(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(sovereignty.DefaultYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := devcluster.Options{Binary: testutil.Binary(t), Dir: dir, Global: &devcluster.GlobalSpec{PolicyFile: pol},
		Regions: []devcluster.RegionSpec{
			{Name: "eu-west", Jurisdiction: "eu", Labels: map[string]string{"tier": "standard"},
				Agents: []devcluster.AgentSpec{{ID: "eu-n1", CPUMillis: 4000, MemoryMiB: 4096}}},
			// us-east's only node is too small for a 2-core task.
			{Name: "us-east", Jurisdiction: "us", Labels: map[string]string{"tier": "standard"},
				Agents: []devcluster.AgentSpec{{ID: "us-n1", CPUMillis: 1000, MemoryMiB: 1024}}},
		}}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, err := devcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	g2, g2addr, err := cl.AddRouter(ctx, "global-2")
	if err != nil {
		cl.Stop()
		t.Fatal(err)
	}
	eu, us := cl.Regions[0], cl.Regions[1]
	t.Cleanup(func() {
		g2.Stop(10 * time.Second)
		cl.Stop()
		if t.Failed() {
			for _, p := range append(append([]*devcluster.Proc{cl.Global, g2}, eu.Coords...), us.Coords...) {
				b, _ := os.ReadFile(p.LogPath)
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("--- %s log tail ---\n%s", p.Name, b)
			}
		}
	})
	jobClient := func(addr string) apiaryv1.JobServiceClient {
		cc, err := cliconn.Dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return apiaryv1.NewJobServiceClient(cc)
	}
	r1, r2 := jobClient(cl.GlobalAddr), jobClient(g2addr)
	euDirect, usDirect := jobClient(eu.Addr()), jobClient(us.Addr())
	cc2, err := cliconn.Dial(g2addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	admin2 := apiaryv1.NewAdminServiceClient(cc2)
	regionUp := func(name string) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := admin2.ListRegions(ctx, &apiaryv1.ListRegionsRequest{})
		if err != nil {
			return false
		}
		for _, r := range resp.GetRegions() {
			if r.GetName() == name {
				return r.GetUp() && r.GetNodesReady() > 0
			}
		}
		return false
	}
	testutil.Eventually(t, 30*time.Second, "second router sees both regions", func() error {
		if !regionUp("eu-west") || !regionUp("us-east") {
			return fmt.Errorf("not yet")
		}
		return nil
	})

	const client = "idem-test"
	regions := []string{"eu-west", "us-east"}
	// keyHomedIn returns a fresh request id whose home region is want.
	n := 0
	keyHomedIn := func(want string) string {
		for {
			n++
			k := fmt.Sprintf("req-%d", n)
			if router.HomeOf(regions, client, k) == want {
				return k
			}
		}
	}
	submitVia := func(c apiaryv1.JobServiceClient, reqID, y string) (*apiaryv1.SubmitJobResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		return c.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: spec(t, y), ClientId: client, RequestId: reqID})
	}
	jobsIn := func(c apiaryv1.JobServiceClient, name string) int {
		var resp *apiaryv1.ListJobsResponse
		testutil.Eventually(t, 15*time.Second, "list jobs", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var err error
			resp, err = c.ListJobs(ctx, &apiaryv1.ListJobsRequest{Limit: 10000})
			return err
		})
		k := 0
		for _, j := range resp.GetJobs() {
			if j.GetSpec().GetName() == name {
				k++
			}
		}
		return k
	}
	small := func(name string) string {
		return "name: " + name + "\ntasks: [{name: a, command: sleep, args: ['0.1'], resources: {cpu_millis: 100}}]\n"
	}

	t.Run("same key through either router: one job", func(t *testing.T) {
		for _, home := range regions {
			k := keyHomedIn(home)
			name := "same-" + home
			first, err := submitVia(r1, k, small(name))
			if err != nil {
				t.Fatal(err)
			}
			if first.GetRegion() != home || first.GetDeduplicated() {
				t.Fatalf("first submission of %s: %+v; want a new job in its home %s", k, first, home)
			}
			for i, c := range []apiaryv1.JobServiceClient{r2, r1, r2} {
				again, err := submitVia(c, k, small(name))
				if err != nil {
					t.Fatalf("repeat %d: %v", i, err)
				}
				if again.GetJobId() != first.GetJobId() || !again.GetDeduplicated() {
					t.Fatalf("repeat %d of %s: %+v; want job %s, deduplicated", i, k, again, first.GetJobId())
				}
			}
			if got := jobsIn(r1, name) + jobsIn(r2, name); got != 2 {
				t.Fatalf("job %s listed %d times through two routers, want 1 each", name, got/2)
			}
			// Another payload under the same key is an error, not a job,
			// also when the other payload has another home (an EU-only
			// payload's only candidate is eu-west): the router looks the
			// key up in every other region before home may create it.
			if _, err := submitVia(r2, k, small(name+"-other")); status.Code(err) != codes.AlreadyExists {
				t.Fatalf("other payload, same key: %v; want ALREADY_EXISTS", err)
			}
			euOnly := "name: " + name + "\njurisdiction: eu\ntasks: [{name: a, command: 'true'}]\n"
			if _, err := submitVia(r1, k, euOnly); status.Code(err) != codes.AlreadyExists {
				t.Fatalf("same key, payload whose home is eu-west (first job in %s): %v; want ALREADY_EXISTS", home, err)
			}
		}
	})

	t.Run("home refuses: forwarded once, every repeat finds the job", func(t *testing.T) {
		k := keyHomedIn("us-east")
		big := "name: big\ntasks: [{name: a, command: sleep, args: ['0.1'], resources: {cpu_millis: 2000}}]\n"
		first, err := submitVia(r1, k, big)
		if err != nil {
			t.Fatal(err)
		}
		if first.GetRegion() != "eu-west" {
			t.Fatalf("too large for its home us-east: went to %s, want eu-west", first.GetRegion())
		}
		for i, c := range []apiaryv1.JobServiceClient{r2, r1} {
			again, err := submitVia(c, k, big)
			if err != nil || again.GetJobId() != first.GetJobId() || !again.GetDeduplicated() {
				t.Fatalf("repeat %d: %+v, %v; want job %s deduplicated", i, again, err, first.GetJobId())
			}
		}
		// The home region itself answers with the forward.
		_, err = submitVia(usDirect, k, big)
		st := status.Convert(err)
		forwarded := ""
		for _, d := range st.Details() {
			if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == ids.ReasonRequestForwarded {
				forwarded = ei.GetMetadata()["region"]
			}
		}
		if st.Code() != codes.FailedPrecondition || forwarded != "eu-west" {
			t.Fatalf("direct to home us-east: %v %v; want FAILED_PRECONDITION forwarding to eu-west", err, st.Details())
		}
		if got := jobsIn(euDirect, "big") + jobsIn(usDirect, "big"); got != 1 {
			t.Fatalf("%d jobs named big, want 1", got)
		}
	})

	t.Run("home region killed between two submissions: outcome unknown, no second job", func(t *testing.T) {
		k := keyHomedIn("us-east")
		fresh := keyHomedIn("us-east")
		first, err := submitVia(r1, k, small("killed"))
		if err != nil || first.GetRegion() != "us-east" {
			t.Fatalf("first: %+v %v", first, err)
		}
		if err := us.Coords[0].Kill(); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 15*time.Second, "second router sees us-east down", func() error {
			if regionUp("us-east") {
				return fmt.Errorf("still up")
			}
			return nil
		})
		for _, c := range []struct{ key, what string }{{k, "accepted before the kill"}, {fresh, "never sent"}} {
			_, err := submitVia(r2, c.key, small("killed"))
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "outcome unknown: region us-east holds or may hold request") {
				t.Fatalf("key %s (%s) with its home down: %v; want UNAVAILABLE outcome unknown", c.key, c.what, err)
			}
		}
		if got := jobsIn(euDirect, "killed"); got != 0 {
			t.Fatalf("eu-west made %d jobs for a request whose home is down", got)
		}
		// A router started after the kill never sees us-east through serf;
		// it learns it from eu-west's coordinators and answers the same.
		g3, g3addr, err := cl.AddRouter(ctx, "global-3")
		if err != nil {
			t.Fatal(err)
		}
		defer g3.Stop(10 * time.Second)
		r3 := jobClient(g3addr)
		testutil.Eventually(t, 30*time.Second, "third router routes", func() error {
			_, err := submitVia(r3, k, small("killed"))
			if status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "outcome unknown: region us-east holds or may hold request") {
				return nil
			}
			if err == nil {
				t.Fatalf("a router started after us-east died made a job for a key whose home is us-east")
			}
			return err
		})
		if got := jobsIn(euDirect, "killed"); got != 0 {
			t.Fatalf("eu-west made %d jobs through the late router", got)
		}
		// The CLI says so and exits 3 (unavailable).
		f := filepath.Join(t.TempDir(), "job.yaml")
		if err := os.WriteFile(f, []byte(small("killed")), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(testutil.Binary(t), "job", "run", f, "--request-id", k, "--addr", g2addr, "--timeout", "2s")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err = cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != 3 || !strings.Contains(out.String(), "outcome unknown") {
			t.Fatalf("job run with the home region down: exit %d, want 3 with 'outcome unknown':\n%s", code, out.String())
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer rcancel()
		if err := us.RestartCoordinator(rctx, 0); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 30*time.Second, "us-east back", func() error {
			if !regionUp("us-east") {
				return fmt.Errorf("down")
			}
			return nil
		})
		again, err := submitVia(r2, k, small("killed"))
		if err != nil || again.GetJobId() != first.GetJobId() || !again.GetDeduplicated() {
			t.Fatalf("after the restart: %+v %v; want job %s deduplicated", again, err, first.GetJobId())
		}
		if got := jobsIn(euDirect, "killed") + jobsIn(usDirect, "killed"); got != 1 {
			t.Fatalf("%d jobs named killed, want 1", got)
		}
	})
}
