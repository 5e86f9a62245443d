package failover

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/internal/testutil/etcdtest"
	"apiary.dev/apiary/regional/store"
)

// standbyServer is eu-central's FailoverService over a real etcd, with an
// admission check like the coordinator's: EU data only where the policy
// allows, decided by this region's policy.
func standbyServer(t *testing.T) (*Server, *clientv3.Client) {
	t.Helper()
	cli := etcdtest.Start(t)
	pol, err := sovereignty.Parse([]byte(sovereignty.DefaultYAML))
	if err != nil {
		t.Fatal(err)
	}
	retry := func(ctx context.Context, build func(context.Context) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
		return build(ctx)
	}
	m := New(Config{Meta: store.MetaRecord{Region: "eu-central", Jurisdiction: "eu", ShardCount: 16}, Client: cli, Retry: retry,
		MayRun: func(spec *apiaryv1.JobSpec) (*store.WhereRecord, error) {
			d := sovereignty.Resolve(pol, spec.GetJurisdiction(), spec.GetDataClass())
			if !d.Any && !d.Allows("eu") {
				return nil, status.Error(codes.FailedPrecondition, "policy")
			}
			return &store.WhereRecord{Rule: d.Rule, Any: d.Any, Jurisdictions: d.Jurisdictions()}, nil
		}})
	return m.Server(), cli
}

func standbyJob(id string) *apiaryv1.StandbyJob {
	return &apiaryv1.StandbyJob{JobId: id, HomeRegion: "eu-west", AfterMs: 5000, Standbys: []string{"eu-central", "eu-north"},
		Spec: &apiaryv1.JobSpec{Name: "j", Jurisdiction: "eu", DataClass: "personal", Tasks: []*apiaryv1.TaskGroup{{Name: "t", Command: "/bin/true"}}}}
}

func TestPutStandbyRefusesWhatItMustNotHold(t *testing.T) {
	srv, cli := standbyServer(t)
	ctx := context.Background()
	id := ids.NewJobID("eu-west", time.Now())
	for _, tc := range []struct {
		name string
		mod  func(*apiaryv1.StandbyJob)
		code codes.Code
		msg  string
	}{
		{"a job id of a third region", func(j *apiaryv1.StandbyJob) { j.JobId = ids.NewJobID("us-east", time.Now()) }, codes.InvalidArgument, "is not a job of region eu-west"},
		{"a job that moved before", func(j *apiaryv1.StandbyJob) { j.HomeEpoch = -1 }, codes.InvalidArgument, "job.home_epoch"},
		{"not this region's job", func(j *apiaryv1.StandbyJob) { j.Standbys = []string{"eu-north"} }, codes.FailedPrecondition, "does not name region eu-central"},
		{"no spec", func(j *apiaryv1.StandbyJob) { j.Spec = nil }, codes.InvalidArgument, "job.spec"},
		{"after out of range", func(j *apiaryv1.StandbyJob) { j.AfterMs = 10 }, codes.InvalidArgument, "job.after_ms"},
		{"secret_env", func(j *apiaryv1.StandbyJob) { j.Spec.Tasks[0].SecretEnv = map[string]string{"K": "v"} }, codes.InvalidArgument, "secret_env"},
		{"forbidden here", func(j *apiaryv1.StandbyJob) { j.Spec.Jurisdiction = "us" }, codes.FailedPrecondition, "policy"},
	} {
		j := standbyJob(id)
		tc.mod(j)
		_, err := srv.PutStandby(ctx, &apiaryv1.PutStandbyRequest{Job: j})
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: %v; want %s containing %q", tc.name, err, tc.code, tc.msg)
		}
	}
	if resp, err := cli.Get(ctx, store.PrefFailover, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("refused records left %d keys (err %v); want none", resp.Count, err)
	}
	// Accepted: stored with this region's own decision (the home sends
	// none) and the spec's defaults.
	if _, err := srv.PutStandby(ctx, &apiaryv1.PutStandbyRequest{Job: standbyJob(id)}); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, store.KeyStandby(id))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("standby record: %v %v", resp, err)
	}
	var rec store.StandbyRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Where == nil || rec.Where.Any || strings.Join(rec.Where.Jurisdictions, ",") != "eu" || rec.Where.Rule == "" {
		t.Errorf("stored where %+v; want this region's decision: only eu", rec.Where)
	}
	if rec.Spec.GetTasks()[0].GetCount() != 1 || rec.Spec.GetMaxAttempts() == 0 {
		t.Errorf("stored spec %v; want the defaults applied (count 1, max_attempts)", rec.Spec)
	}

	// ClaimJob: only another standby of the job; a claim drops the record.
	if _, err := srv.ClaimJob(ctx, &apiaryv1.ClaimJobRequest{JobId: id, StandbyRegion: "zz-nowhere"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("claim by a region that is no standby: %v; want PermissionDenied", err)
	}
	// The witness rule: no grant while a majority of this region's three
	// coordinators have not seen the home down for the job's after (5 s).
	for _, c := range []string{"c1", "c2", "c3"} {
		if _, err := cli.Put(ctx, store.PrefMembers+c, "x"); err != nil {
			t.Fatal(err)
		}
	}
	observe := func(coord string, downFor time.Duration) {
		t.Helper()
		v := store.MustJSON(store.ObserveRecord{DownSinceMs: time.Now().Add(-downFor).UnixMilli()})
		if _, err := cli.Put(ctx, store.KeyObserve("eu-west", coord), v); err != nil {
			t.Fatal(err)
		}
	}
	home := func() *apiaryv1.MovedJobsResponse {
		t.Helper()
		r, err := srv.MovedJobs(ctx, &apiaryv1.MovedJobsRequest{HomeRegion: "eu-west"})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	refused := func(stage string, jobID string) {
		t.Helper()
		if g, err := srv.ClaimJob(ctx, &apiaryv1.ClaimJobRequest{JobId: jobID, StandbyRegion: "eu-north", AfterMs: 5000}); status.Code(err) != codes.Aborted ||
			!strings.Contains(status.Convert(err).Message(), "not yet the job's after") {
			t.Errorf("%s: claim %v %v; want Aborted: the home is not seen down for after here", stage, g, err)
		}
	}
	refused("no coordinator sees the home down", id)
	observe("c1", time.Minute)
	observe("c2", 2*time.Second)
	refused("one of three sees it down for after", id)
	if d := home().GetHomeDownForMs(); d < 1500 || d > 10_000 {
		t.Errorf("MovedJobs home_down_for_ms = %d; want about 2000 (the second-longest of two observations of three members)", d)
	}
	observe("c2", 6*time.Second)
	if d := home().GetHomeDownForMs(); d < 5000 {
		t.Errorf("MovedJobs home_down_for_ms = %d; want >= 5000 (a majority has seen the home down for 6 s)", d)
	}
	// A job this region holds no record of (its PutStandby failed): the
	// claim is granted (else the other standby could never activate it),
	// again on a retry, and bars a late record from being stored.
	other := ids.NewJobID("eu-west", time.Now())
	for i := 0; i < 2; i++ {
		if g, err := srv.ClaimJob(ctx, &apiaryv1.ClaimJobRequest{JobId: other, StandbyRegion: "eu-north", AfterMs: 5000}); err != nil || !g.GetGranted() {
			t.Errorf("claim %d of a job held nowhere here: %v %v; want granted", i, g, err)
		}
	}
	if _, err := srv.PutStandby(ctx, &apiaryv1.PutStandbyRequest{Job: standbyJob(other)}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("standby record of a claimed job: %v; want FailedPrecondition", err)
	}
	if g, err := srv.ClaimJob(ctx, &apiaryv1.ClaimJobRequest{JobId: other, StandbyRegion: "eu-south"}); err != nil || g.GetGranted() {
		t.Errorf("a second claimer: %v %v; want refused (claimed by eu-north)", g, err)
	}
	// PushProgress: a task the job does not have, a zero token.
	for _, d := range []*apiaryv1.TaskDone{{JobId: id, TaskIndex: 5, Attempt: 1, FencingToken: 9}, {JobId: id, TaskIndex: 0, Attempt: 1, FencingToken: 0}} {
		if _, err := srv.PushProgress(ctx, &apiaryv1.PushProgressRequest{HomeRegion: "eu-west", Done: []*apiaryv1.TaskDone{d}}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("progress %v: %v; want InvalidArgument", d, err)
		}
	}
	// eu-central comes first in the job's order and a majority of its
	// coordinators see the home down for after: it takes the job over
	// itself and refuses the later standby (by the majority's view, not the
	// one coordinator's that answers).
	if g, err := srv.ClaimJob(ctx, &apiaryv1.ClaimJobRequest{JobId: id, StandbyRegion: "eu-north"}); status.Code(err) != codes.Aborted ||
		!strings.Contains(status.Convert(err).Message(), "an earlier standby") {
		t.Fatalf("claim by the later standby: %v %v; want Aborted: the earlier standby is taking it over", g, err)
	}
	// The job ends at home: the record goes, a tombstone stays, and a
	// standby that missed the end is refused (and drops its leftover), as
	// is a late standby record.
	if _, err := srv.PushProgress(ctx, &apiaryv1.PushProgressRequest{HomeRegion: "eu-west", Ended: []string{id}}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := cli.Get(ctx, store.KeyStandby(id)); len(resp.Kvs) != 0 {
		t.Error("the standby record survived the job's end")
	}
	if g, err := srv.ClaimJob(ctx, &apiaryv1.ClaimJobRequest{JobId: id, StandbyRegion: "eu-north", AfterMs: 5000}); err != nil || g.GetGranted() ||
		!strings.Contains(g.GetActiveRegion(), "ended") {
		t.Errorf("claim of a job that ended at home: %v %v; want refused: ended", g, err)
	}
	if _, err := srv.PutStandby(ctx, &apiaryv1.PutStandbyRequest{Job: standbyJob(id)}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a late standby record of an ended job: %v; want FailedPrecondition", err)
	}
	// The home learns of the claim and holds that job.
	var claimed []string
	for _, c := range home().GetClaimed() {
		if c.GetClaimedBy() != "eu-north" {
			t.Errorf("claimed %s by %s; want eu-north", c.GetJobId(), c.GetClaimedBy())
		}
		claimed = append(claimed, c.GetJobId())
	}
	if len(claimed) != 1 || !slices.Contains(claimed, other) {
		t.Errorf("MovedJobs claimed %v; want %s", claimed, other)
	}
	if _, err := srv.ClaimJob(ctx, &apiaryv1.ClaimJobRequest{JobId: ids.NewJobID("eu-west", time.Now()), StandbyRegion: "eu-north"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a claim of a job held nowhere here without after_ms: %v; want InvalidArgument", err)
	}

	// Acknowledged jobs (the home marked them MOVED) leave the answers: a
	// moved record and a claim; an id of another region is refused.
	movedID := ids.NewJobID("eu-west", time.Now())
	if _, err := cli.Put(ctx, store.KeyMoved(movedID), store.MustJSON(store.MovedRecord{Home: "eu-west", Epoch: 1, MovedMs: 1})); err != nil {
		t.Fatal(err)
	}
	if r := home(); len(r.GetMoved()) != 1 || r.GetMoved()[0].GetJobId() != movedID || r.GetMoved()[0].GetActiveRegion() != "eu-central" {
		t.Fatalf("MovedJobs moved %v; want %s active in eu-central", r.GetMoved(), movedID)
	}
	if _, err := srv.MovedJobs(ctx, &apiaryv1.MovedJobsRequest{HomeRegion: "eu-west", Acknowledged: []string{ids.NewJobID("us-east", time.Now())}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an acknowledgement of another region's job: %v; want InvalidArgument", err)
	}
	r, err := srv.MovedJobs(ctx, &apiaryv1.MovedJobsRequest{HomeRegion: "eu-west", Acknowledged: []string{movedID, id, other}})
	if err != nil || len(r.GetMoved())+len(r.GetClaimed()) != 0 {
		t.Errorf("after the acknowledgement: moved %v, claimed %v (err %v); want none", r.GetMoved(), r.GetClaimed(), err)
	}
}

// TestReleaseAndDropClaim: a home that is back ends a claim left behind.
// The claimer gives its record up only while the job is not activated
// there and it does not see the home down; the granter drops only the
// claim of the region named.
func TestReleaseAndDropClaim(t *testing.T) {
	srv, cli := standbyServer(t)
	ctx := context.Background()
	for _, c := range []string{"c1", "c2", "c3"} {
		if _, err := cli.Put(ctx, store.PrefMembers+c, "x"); err != nil {
			t.Fatal(err)
		}
	}
	id := ids.NewJobID("eu-west", time.Now())
	if _, err := srv.PutStandby(ctx, &apiaryv1.PutStandbyRequest{Job: standbyJob(id)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  *apiaryv1.ReleaseJobRequest
	}{
		{"a job of another region", &apiaryv1.ReleaseJobRequest{HomeRegion: "eu-west", JobId: ids.NewJobID("us-east", time.Now())}},
		{"this region as home", &apiaryv1.ReleaseJobRequest{HomeRegion: "eu-central", JobId: id}},
		{"no job id", &apiaryv1.ReleaseJobRequest{HomeRegion: "eu-west"}},
	} {
		if _, err := srv.ReleaseJob(ctx, tc.req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("release, %s: %v; want InvalidArgument", tc.name, err)
		}
	}
	// A majority here sees the home down: this region may be activating.
	for _, c := range []string{"c1", "c2"} {
		if _, err := cli.Put(ctx, store.KeyObserve("eu-west", c), store.MustJSON(store.ObserveRecord{DownSinceMs: time.Now().Add(-time.Second).UnixMilli()})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := srv.ReleaseJob(ctx, &apiaryv1.ReleaseJobRequest{HomeRegion: "eu-west", JobId: id}); status.Code(err) != codes.Aborted {
		t.Errorf("release while a majority sees the home down: %v; want Aborted", err)
	}
	if resp, _ := cli.Get(ctx, store.KeyStandby(id)); len(resp.Kvs) != 1 {
		t.Fatal("a refused release dropped the standby record")
	}
	if _, err := cli.Delete(ctx, store.PrefObserve("eu-west"), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	before, err := cli.Get(ctx, store.KeyStandby(id))
	if err != nil {
		t.Fatal(err)
	}
	srv.m.cfg.Now = func() time.Time { return time.Now().Add(time.Minute) }
	r, err := srv.ReleaseJob(ctx, &apiaryv1.ReleaseJobRequest{HomeRegion: "eu-west", JobId: id})
	srv.m.cfg.Now = time.Now
	if err != nil || !r.GetReleased() {
		t.Fatalf("release: %v %v; want released", r, err)
	}
	// Kept (it still protects the job), at a new revision (an activation
	// in flight fails) and a new stored time (due only after a new outage).
	after, err := cli.Get(ctx, store.KeyStandby(id))
	if err != nil || len(after.Kvs) != 1 {
		t.Fatalf("released: the standby record is gone (%v)", err)
	}
	var was, now store.StandbyRecord
	_ = json.Unmarshal(before.Kvs[0].Value, &was)
	_ = json.Unmarshal(after.Kvs[0].Value, &now)
	if after.Kvs[0].ModRevision == before.Kvs[0].ModRevision || now.StoredMs < was.StoredMs+50_000 {
		t.Errorf("released: record at revision %d stored %d, was %d stored %d; want a new revision and stored time",
			after.Kvs[0].ModRevision, now.StoredMs, before.Kvs[0].ModRevision, was.StoredMs)
	}
	// Activated here: never released; the answer says where it runs.
	moved := ids.NewJobID("eu-west", time.Now())
	if _, err := cli.Put(ctx, store.KeyMoved(moved), store.MustJSON(store.MovedRecord{Home: "eu-west", Epoch: 1, MovedMs: 7})); err != nil {
		t.Fatal(err)
	}
	if r, err := srv.ReleaseJob(ctx, &apiaryv1.ReleaseJobRequest{HomeRegion: "eu-west", JobId: moved}); err != nil || r.GetReleased() ||
		r.GetMoved().GetActiveRegion() != "eu-central" || r.GetMoved().GetEpoch() != 1 {
		t.Errorf("release of a job activated here: %v %v; want not released, moved to eu-central at epoch 1", r, err)
	}
	// ... also once its moved record was acknowledged (the job key stays).
	acked := ids.NewJobID("eu-west", time.Now())
	job := store.JobRecord{ID: acked, Failover: &store.FailoverRecord{Home: "eu-west", Epoch: 2, MovedMs: 9}}
	if _, err := cli.Put(ctx, store.KeyJob(0, acked), store.MustJSON(job)); err != nil {
		t.Fatal(err)
	}
	srv.m.cfg.Meta.ShardCount = 1
	if r, err := srv.ReleaseJob(ctx, &apiaryv1.ReleaseJobRequest{HomeRegion: "eu-west", JobId: acked}); err != nil || r.GetReleased() || r.GetMoved().GetEpoch() != 2 {
		t.Errorf("release of a job active here whose moved record is gone: %v %v; want not released, epoch 2", r, err)
	}
	srv.m.cfg.Meta.ShardCount = 16

	// DropClaim: only the claim of the region named.
	claimed := ids.NewJobID("eu-west", time.Now())
	if _, err := cli.Put(ctx, store.KeyClaimed(claimed), store.MustJSON(store.ClaimRecord{By: "eu-north", AtMs: 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.DropClaim(ctx, &apiaryv1.DropClaimRequest{HomeRegion: "eu-west", JobId: claimed, ClaimedBy: "eu-south"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("drop a claim naming the wrong claimer: %v; want FailedPrecondition", err)
	}
	if _, err := srv.DropClaim(ctx, &apiaryv1.DropClaimRequest{HomeRegion: "eu-west", JobId: claimed}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("drop a claim naming no claimer: %v; want InvalidArgument", err)
	}
	if got := len(mustMoved(t, srv).GetClaimed()); got != 1 {
		t.Fatalf("MovedJobs lists %d claims; want 1 before the drop", got)
	}
	// The claimer asks again while this region sees the home up: the claim
	// left behind is no grant (the witness rule holds for a repeat too).
	if g, err := srv.ClaimJob(ctx, &apiaryv1.ClaimJobRequest{JobId: claimed, StandbyRegion: "eu-north", AfterMs: 5000}); status.Code(err) != codes.Aborted {
		t.Errorf("a repeated claim while the home is seen up: %v %v; want Aborted", g, err)
	}
	for i := 0; i < 2; i++ {
		if r, err := srv.DropClaim(ctx, &apiaryv1.DropClaimRequest{HomeRegion: "eu-west", JobId: claimed, ClaimedBy: "eu-north"}); err != nil || !r.GetDropped() {
			t.Errorf("drop %d: %v %v; want dropped", i, r, err)
		}
	}
	if got := mustMoved(t, srv).GetClaimed(); len(got) != 0 {
		t.Errorf("MovedJobs lists claims %v after the drop; want none (the home runs the job again)", got)
	}
	if _, err := srv.PutStandby(ctx, &apiaryv1.PutStandbyRequest{Job: standbyJob(claimed)}); err != nil {
		t.Errorf("the record written again after the claim was dropped: %v", err)
	}
}

func mustMoved(t *testing.T, srv *Server) *apiaryv1.MovedJobsResponse {
	t.Helper()
	r, err := srv.MovedJobs(context.Background(), &apiaryv1.MovedJobsRequest{HomeRegion: "eu-west"})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestActivationFollowsTheMajorityNotTheLeader: the region's failover leader
// still reaches the home, but a majority of its coordinators see it down for
// after: the job is activated (the breaker's stall: the leader's own view
// kept it from activating while the region, by the majority, refused to
// give it up to a later standby).
func TestActivationFollowsTheMajorityNotTheLeader(t *testing.T) {
	srv, cli := standbyServer(t)
	m := srv.m
	ctx := context.Background()
	stored := time.Now().Add(-2 * time.Minute)
	m.cfg.Now = func() time.Time { return stored }
	id := ids.NewJobID("eu-west", stored)
	j := standbyJob(id)
	j.Standbys = []string{"eu-central"}
	if _, err := srv.PutStandby(ctx, &apiaryv1.PutStandbyRequest{Job: j}); err != nil {
		t.Fatal(err)
	}
	m.cfg.Now = time.Now
	for _, c := range []string{"c1", "c2", "c3"} {
		if _, err := cli.Put(ctx, store.KeyMember(c), "x"); err != nil {
			t.Fatal(err)
		}
	}
	if m.DownFor("eu-west") != 0 {
		t.Fatal("the leader sees the home down; want up")
	}
	// One of three sees it down: not due.
	if _, err := cli.Put(ctx, store.KeyObserve("eu-west", "c2"), store.MustJSON(store.ObserveRecord{DownSinceMs: time.Now().Add(-time.Minute).UnixMilli()})); err != nil {
		t.Fatal(err)
	}
	m.activateDue(ctx)
	if r, _ := cli.Get(ctx, store.KeyMoved(id)); len(r.Kvs) != 0 {
		t.Fatal("activated with one observer of three")
	}
	// Two of three: due, whatever the leader itself sees.
	if _, err := cli.Put(ctx, store.KeyObserve("eu-west", "c3"), store.MustJSON(store.ObserveRecord{DownSinceMs: time.Now().Add(-time.Minute).UnixMilli()})); err != nil {
		t.Fatal(err)
	}
	m.activateDue(ctx)
	if r, _ := cli.Get(ctx, store.KeyMoved(id)); len(r.Kvs) != 1 {
		t.Error("not activated although a majority has seen the home down for after")
	}
}

// TestTombstonesShareALease: many ends, one lease (the breaker counted one
// lease per PushProgress call, millions a week).
func TestTombstonesShareALease(t *testing.T) {
	srv, cli := standbyServer(t)
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if _, err := srv.PushProgress(ctx, &apiaryv1.PushProgressRequest{HomeRegion: "eu-west", Ended: []string{ids.NewJobID("eu-west", time.Now())}}); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls.Leases) != 1 {
		t.Errorf("%d leases after 20 calls with one end each; want 1", len(ls.Leases))
	}
	resp, err := cli.Get(ctx, store.PrefEnded, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 20 {
		t.Errorf("%d tombstones (err %v); want 20", resp.Count, err)
	}
}
