package regional_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// TestRegionIdentity: a region that declares no jurisdiction refuses a job
// pinned to one (it could never place it), and a region's jurisdiction is
// fixed at creation: restarting its data dir with another one fails.
func TestRegionIdentity(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Name: "plain"})
	c := dial(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: spec(t, "name: pinned\njurisdiction: eu\ntasks:\n  - name: a\n    command: \"true\"\n")})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "declares no jurisdiction") {
		t.Fatalf("pinned job on a region without jurisdiction: %v", err)
	}
	// With no node at all, a pending task says so.
	id := submit(t, c, spec(t, "name: waits\ntasks:\n  - name: a\n    command: \"true\"\n"))
	testutil.Eventually(t, 10*time.Second, "no-ready-nodes reason", func() error {
		j, err := getJob(c, id)
		if err != nil {
			return err
		}
		if got := j.GetTasks()[0].GetUnplacedReason(); got != "no ready nodes in region plain" {
			return fmt.Errorf("reason %q", got)
		}
		return nil
	})
	p := r.Coords[0]
	p.Stop(10 * time.Second)
	p.Args = append(p.Args, "--jurisdiction", "us")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "restart with another jurisdiction refused", func() error {
		if p.Running() {
			return os.ErrExist
		}
		return nil
	})
	b, _ := os.ReadFile(p.LogPath)
	if !strings.Contains(string(b), `jurisdiction: region plain was created in jurisdiction "", not "us"`) {
		t.Fatalf("log does not explain the refusal:\n%s", b)
	}
}
