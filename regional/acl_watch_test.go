package regional_test

// Issue 19, an adversarial finding: an open WatchJob outlived the
// revocation of its token (the ACL was checked on open only).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// TestACLWatchRechecksToken: a region with ACLs (and no nodes, so jobs
// stay pending) re-judges the token of an open WatchJob before every
// message: after its token is revoked, after it expires, and after its
// policy stops granting read on the job's namespace, the change that
// follows (a cancellation) is not sent: the stream ends with
// UNAUTHENTICATED or PERMISSION_DENIED. A management token's stream
// still sees the cancellation and ends cleanly.
func TestACLWatchRechecksToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl := startCluster(t, ctx, devcluster.Options{Binary: testutil.Binary(t), Dir: t.TempDir(), Regions: []devcluster.RegionSpec{
		{Name: "eu-west", Jurisdiction: "eu", ExtraArgs: []string{"--acl"}}}})
	r := cl.Regions[0]
	boot, err := asToken(t, cl, r, "").acl.BootstrapACL(callCtx(t), &apiaryv1.BootstrapACLRequest{})
	if err != nil {
		t.Fatal(err)
	}
	m := asToken(t, cl, r, boot.GetToken().GetSecretId())
	applyPolicy(t, m, "team-a", "namespaces:\n  - name: a\n    capabilities: [submit, read, cancel]\n")
	applyPolicy(t, m, "reader", "namespaces:\n  - name: a\n    capabilities: [read]\n")
	// The expiring token first: its watch must open before it expires.
	expiring := mkToken(t, m, &apiaryv1.CreateACLTokenRequest{Name: "expiring", Policies: []string{"team-a"}, TtlMs: 2500})
	revoked := mkToken(t, m, &apiaryv1.CreateACLTokenRequest{Name: "revoked", Policies: []string{"team-a"}})
	reader := mkToken(t, m, &apiaryv1.CreateACLTokenRequest{Name: "reader", Policies: []string{"reader"}})

	wctx, wcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer wcancel()
	type watch struct {
		name, job string
		w         apiaryv1.JobService_WatchJobClient
	}
	open := func(name, secret string) watch {
		t.Helper()
		job := submitAs(t, m, nsSpec(t, "a", "true"), "", "")
		w, err := asToken(t, cl, r, secret).jobs.WatchJob(wctx, &apiaryv1.WatchJobRequest{JobId: job})
		if err != nil {
			t.Fatalf("%s: WatchJob: %v", name, err)
		}
		first, err := w.Recv()
		if err != nil || first.GetJob().GetId() != job {
			t.Fatalf("%s: the watch's first message: %v, %v", name, first, err)
		}
		return watch{name, job, w}
	}
	we := open("expired token", expiring.GetSecretId())
	wr := open("revoked token", revoked.GetSecretId())
	wp := open("policy without read", reader.GetSecretId())
	wm := open("management token", boot.GetToken().GetSecretId())

	if _, err := m.acl.RevokeACLToken(callCtx(t), &apiaryv1.RevokeACLTokenRequest{AccessorId: revoked.GetAccessorId()}); err != nil {
		t.Fatal(err)
	}
	applyPolicy(t, m, "reader", "namespaces:\n  - name: b\n    capabilities: [read]\n")
	e := asToken(t, cl, r, expiring.GetSecretId())
	testutil.Eventually(t, 20*time.Second, "the 2.5 s token expired", func() error {
		if _, err := e.jobs.ListJobs(callCtx(t), &apiaryv1.ListJobsRequest{}); status.Code(err) != codes.Unauthenticated {
			return fmt.Errorf("ListJobs with it: %v", err)
		}
		return nil
	})
	for _, w := range []watch{we, wr, wp, wm} {
		if _, err := m.jobs.CancelJob(callCtx(t), &apiaryv1.CancelJobRequest{JobId: w.job}); err != nil {
			t.Fatalf("cancel %s: %v", w.job, err)
		}
	}
	// until returns the error that ends w, failing on a message that shows
	// the cancellation (sent after the token lost the job).
	until := func(w watch) (cancelled bool, err error) {
		for {
			msg, err := w.w.Recv()
			if err != nil {
				return cancelled, err
			}
			if msg.GetJob().GetCancelRequested() {
				cancelled = true
			}
		}
	}
	for _, tc := range []struct {
		w    watch
		code codes.Code
		text string
	}{
		{wr, codes.Unauthenticated, "ACL token not found in region eu-west"},
		{we, codes.Unauthenticated, "ACL token " + expiring.GetAccessorId() + " expired at"},
		{wp, codes.PermissionDenied, `JobService/WatchJob needs capability "read" on namespace "a"; ACL token ` + reader.GetAccessorId()},
	} {
		cancelled, err := until(tc.w)
		if cancelled {
			t.Errorf("%s: the watch sent the job's cancellation after the token lost it", tc.w.name)
		}
		refused(t, tc.w.name+": the watch's end", err, tc.code, tc.text)
	}
	if cancelled, err := until(wm); !cancelled || !errors.Is(err, io.EOF) {
		t.Errorf("management token: the watch saw the cancellation %v and ended with %v; want the cancellation, then EOF", cancelled, err)
	}
}
