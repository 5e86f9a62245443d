package failover

import (
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/sovereignty"
	"apiary.dev/apiary/regional/store"
)

func TestPlanChoosesStandbysAsRoutingWould(t *testing.T) {
	pol, err := sovereignty.Parse([]byte(sovereignty.DefaultYAML))
	if err != nil {
		t.Fatal(err)
	}
	fp := pol.Fingerprint()
	reg := func(name, jur string, up bool) federation.Region {
		return federation.Region{Name: name, Jurisdiction: jur, Labels: map[string]string{"jurisdiction": jur}, Up: up, Policy: fp,
			DownReason: map[bool]string{false: "no coordinator alive"}[up]}
	}
	regions := []federation.Region{reg("eu-west", "eu", true), reg("eu-central", "eu", true), reg("eu-north", "eu", true),
		reg("eu-south", "eu", false), reg("us-east", "us", true)}
	cfg := Config{Meta: store.MetaRecord{Region: "eu-west", Jurisdiction: "eu"}, Policy: pol}
	eu := func(f *apiaryv1.Failover) *apiaryv1.JobSpec {
		return &apiaryv1.JobSpec{Name: "j", Jurisdiction: "eu", Failover: f, Tasks: []*apiaryv1.TaskGroup{{Name: "t", Count: 1, Command: "x"}}}
	}
	for _, tc := range []struct {
		name     string
		cfg      func(Config) Config
		spec     *apiaryv1.JobSpec
		inPool   bool
		nil_     bool
		standbys string
		after    int64
		why      []string
	}{
		{name: "no block, no region default", spec: eu(nil), inPool: true, nil_: true},
		{name: "disabled", spec: eu(&apiaryv1.Failover{Disabled: true}), cfg: func(c Config) Config { c.DefaultAfter = 10e9; return c }, inPool: true, nil_: true},
		{name: "region default opts in", spec: eu(nil), cfg: func(c Config) Config { c.DefaultAfter = 10e9; return c }, inPool: true,
			standbys: "eu-central,eu-north", after: 10000},
		{name: "auto: EU regions up, by name; never us-east or a down region", spec: eu(&apiaryv1.Failover{}), inPool: true,
			standbys: "eu-central,eu-north", after: DefaultAfter.Milliseconds()},
		{name: "the job's order", spec: eu(&apiaryv1.Failover{AfterMs: 5000, Regions: []string{"eu-north", "eu-central"}}), inPool: true,
			standbys: "eu-north,eu-central", after: 5000},
		{name: "peers narrow auto", spec: eu(&apiaryv1.Failover{}), cfg: func(c Config) Config { c.Peers = []string{"eu-north"}; return c }, inPool: true,
			standbys: "eu-north", after: DefaultAfter.Milliseconds()},
		{name: "job regions outside the peers", spec: eu(&apiaryv1.Failover{Regions: []string{"eu-central"}}),
			cfg: func(c Config) Config { c.Peers = []string{"eu-north"}; return c }, inPool: true, why: []string{"none of them is in the home region's --failover-peers"}},
		{name: "only forbidden or down regions named", spec: eu(&apiaryv1.Failover{Regions: []string{"us-east", "eu-south"}}), inPool: true,
			why: []string{"us-east: policy", "eu-south: down", "eu-central: not in failover.regions"}},
		{name: "US personal data: no other US region", spec: &apiaryv1.JobSpec{Name: "j", Jurisdiction: "us", DataClass: "personal", Failover: &apiaryv1.Failover{},
			Tasks: []*apiaryv1.TaskGroup{{Name: "t", Count: 1, Command: "x"}}}, inPool: true, why: []string{"eu-central: policy", "us-personal-in-us"},
			cfg: func(c Config) Config { c.Meta = store.MetaRecord{Region: "us-east", Jurisdiction: "us"}; return c }},
		{name: "no pool", spec: eu(&apiaryv1.Failover{}), why: []string{"in no WAN pool"}},
	} {
		c := cfg
		if tc.cfg != nil {
			c = tc.cfg(c)
		}
		got := plan(c, tc.inPool, regions, tc.spec)
		switch {
		case tc.nil_:
			if got != nil {
				t.Errorf("%s: %+v; want no failover", tc.name, got)
			}
		case got == nil:
			t.Errorf("%s: no failover record", tc.name)
		case tc.standbys != "":
			if s := strings.Join(got.Standbys, ","); s != tc.standbys || got.AfterMs != tc.after || got.NotEligible != "" {
				t.Errorf("%s: standbys %s after %d (%q); want %s after %d", tc.name, s, got.AfterMs, got.NotEligible, tc.standbys, tc.after)
			}
		default:
			if len(got.Standbys) != 0 {
				t.Errorf("%s: standbys %v; want none", tc.name, got.Standbys)
			}
			for _, w := range tc.why {
				if !strings.Contains(got.NotEligible, w) {
					t.Errorf("%s: reason %q; want it to contain %q", tc.name, got.NotEligible, w)
				}
			}
		}
	}
}

func TestMajorityDownFor(t *testing.T) {
	now := int64(100_000)
	for _, tc := range []struct {
		since   []int64
		members int64
		want    int64
	}{
		{nil, 3, 0},
		{[]int64{now - 9000}, 3, 0},                            // one of three
		{[]int64{now - 9000, now - 2000}, 3, 2000},             // the second-longest of a majority of two
		{[]int64{now - 2000, now - 9000, now - 5000}, 3, 5000}, // unordered
		{[]int64{now - 9000, now - 8000}, 4, 0},                // two of four is no majority
		{[]int64{now - 9000}, 1, 9000},
		{[]int64{now + 500}, 1, 0}, // a clock ahead counts as no time
		{[]int64{now - 9000}, 0, 0},
	} {
		if got := majorityDownFor(now, tc.since, tc.members); got != tc.want {
			t.Errorf("majorityDownFor(%v, members %d) = %d; want %d", tc.since, tc.members, got, tc.want)
		}
	}
}

func TestDueNeedsAMajorityOfObservers(t *testing.T) {
	now := int64(100_000)
	for _, tc := range []struct {
		since   []int64
		members int64
		want    bool
	}{
		{nil, 3, false},
		{[]int64{now - 6000}, 3, false},             // one observer of three
		{[]int64{now - 6000, now - 6000}, 3, true},  // two of three
		{[]int64{now - 6000, now - 4000}, 3, false}, // the second not long enough
		{[]int64{now - 6000}, 1, true},              // a one-coordinator region
		{[]int64{now - 6000, now - 6000}, 4, false}, // two of four is no majority
		{[]int64{now - 6000}, 0, false},             // no live member known
		{[]int64{now - 9500}, 1, false},             // down since before the record was stored: the home wrote it, alive
	} {
		if got := due(5000, now, now-9000, tc.since, tc.members); got != tc.want {
			t.Errorf("due(after 5s, stored 9 s ago, since %v, members %d) = %v; want %v", tc.since, tc.members, got, tc.want)
		}
	}
}

func TestHoldWhileNoStandbySeesTheHomeUpWithinHalfAfter(t *testing.T) {
	now := time.Unix(1000, 0)
	m := New(Config{Meta: store.MetaRecord{Region: "eu-west"}, Now: func() time.Time { return now }})
	rec := &store.JobRecord{ID: "eu-west-x", Failover: &store.FailoverRecord{AfterMs: 10_000, Standbys: []string{"eu-central", "eu-north"}}}
	up := &apiaryv1.MovedJobsResponse{}
	if !m.Hold(rec) {
		t.Fatal("no standby answered yet; want held")
	}
	m.recordAnswer("eu-central", now.Add(-time.Second), up)
	if m.Hold(rec) {
		t.Fatal("eu-central saw the home up 1 s ago (after/2 = 5 s); want dispatched: eu-north cannot activate without its grant")
	}
	now = now.Add(5 * time.Second) // eu-central's answer is 6 s old
	if !m.Hold(rec) {
		t.Fatal("the only answer is older than after/2; want held")
	}
	// One-way partition: eu-north answers at once, but a majority of its
	// coordinators have seen the home down for 4 s: the lease counts from
	// then, 4 s ago, so it holds for 1 s more, not 5.
	m.recordAnswer("eu-north", now, &apiaryv1.MovedJobsResponse{HomeDownForMs: 4000})
	if m.Hold(rec) {
		t.Fatal("eu-north's majority saw the home up 4 s ago; want dispatched")
	}
	now = now.Add(1500 * time.Millisecond)
	m.recordAnswer("eu-north", now, &apiaryv1.MovedJobsResponse{HomeDownForMs: 5500})
	if !m.Hold(rec) {
		t.Fatal("eu-north has seen the home down for 5.5 s (> after/2) and eu-central is silent; want held")
	}
	// eu-central answers again, seeing the home up, but has granted the
	// job to eu-north: held until eu-north says it moved.
	m.recordAnswer("eu-central", now, &apiaryv1.MovedJobsResponse{Claimed: []*apiaryv1.ClaimedJob{{JobId: rec.ID, ClaimedBy: "eu-north"}}})
	if !m.Hold(rec) {
		t.Fatal("claimed by eu-north; want held")
	}
	// Released at eu-north (its record rewritten: the claim can no longer
	// make it activate): not held, though eu-central still lists the claim
	// (it may be unreachable for good); a claim by another region still
	// holds.
	m.released = map[string]string{rec.ID: "eu-north"}
	if m.Hold(rec) {
		t.Fatal("the claimer released the job; want dispatched")
	}
	m.recordAnswer("eu-central", now, &apiaryv1.MovedJobsResponse{Claimed: []*apiaryv1.ClaimedJob{{JobId: rec.ID, ClaimedBy: "eu-south"}}})
	if !m.Hold(rec) {
		t.Fatal("claimed by a region that did not release it; want held")
	}
	m.recordAnswer("eu-central", now, up)
	if m.Hold(rec) {
		t.Fatal("eu-central sees the home up and holds no claim; want dispatched")
	}
	for _, r := range []*store.JobRecord{nil, {ID: "j"}, {ID: "j", Failover: &store.FailoverRecord{NotEligible: "x"}},
		{ID: "j", Failover: &store.FailoverRecord{Epoch: 1, Standbys: []string{"eu-central"}}},
		{ID: "j", Failover: &store.FailoverRecord{MovedTo: "eu-central", Standbys: []string{"eu-central"}}}} {
		if m.Hold(r) {
			t.Errorf("Hold(%+v) = true; want false (nothing to wait for)", r)
		}
	}
}
