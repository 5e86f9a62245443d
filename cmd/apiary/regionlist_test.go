package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// region list's COORDINATORS cell: each alive coordinator with whether it
// answers, its health and the shards it owns; none for one that publishes
// no count (-1, an older coordinator) or is not alive (its last tags are
// stale); five coordinators fit without truncation.
func TestPrintRegionsShardsPerCoordinator(t *testing.T) {
	reg := &apiaryv1.RegionSummary{Name: "eu-west", Jurisdiction: "eu", Up: true, Coordinators: []*apiaryv1.RegionCoordinator{
		{Id: "eu-west-c1", MemberStatus: "alive", Health: "no-nodes", Answers: true, ShardsOwned: 86},
		{Id: "eu-west-c2", MemberStatus: "alive", Health: "no-nodes", Answers: true, ShardsOwned: 0},
		{Id: "eu-west-c3", MemberStatus: "alive", Health: "no-nodes", Answers: false, ShardsOwned: -1},
		{Id: "eu-west-c4", MemberStatus: "failed", Health: "ok", ShardsOwned: 85},
		{Id: "eu-west-c5", MemberStatus: "alive", Health: "no-nodes", Answers: true, ShardsOwned: 170},
	}}
	var out, errs bytes.Buffer
	printRegions(&out, &errs, []*apiaryv1.RegionSummary{reg})
	t.Logf("\n%s", out.String())
	want := "eu-west-c1(alive,answers,no-nodes,86 shards) eu-west-c2(alive,answers,no-nodes,0 shards) " +
		"eu-west-c3(alive,no answer,no-nodes) eu-west-c4(failed) eu-west-c5(alive,answers,no-nodes,170 shards)"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("the COORDINATORS cell is not\n%s", want)
	}
	if errs.Len() != 0 {
		t.Fatalf("stderr: %s", errs.String())
	}
	// Wider than the cap: truncated with "...", not wrapped.
	for i := range 3 {
		reg.Coordinators = append(reg.Coordinators, &apiaryv1.RegionCoordinator{Id: fmt.Sprintf("eu-west-extra-%d", i), MemberStatus: "alive",
			Health: "no-nodes", Answers: true, ShardsOwned: 1})
	}
	out.Reset()
	printRegions(&out, &errs, []*apiaryv1.RegionSummary{reg})
	if strings.Contains(out.String(), "eu-west-extra-2(") || !strings.Contains(out.String(), "...") {
		t.Fatalf("eight coordinators are not truncated:\n%s", out.String())
	}
}

// region status's pending line: the count as is when it is current, with
// its revision when the coordinator's job index lagged, and "unknown"
// while the index loads.
func TestPrintRegionStatusPendingAge(t *testing.T) {
	for _, c := range []struct {
		pending      int32
		rev, pendRev int64
		want         string
	}{
		{12, 500, 500, "Pending tasks:  12\n"},
		{12, 500, 430, "Pending tasks:  12 (as of revision 430 of 500: the coordinator's job index lags etcd)\n"},
		{0, 500, -1, "Pending tasks:  unknown (the coordinator's job index is loading)\n"},
		{12, 500, 0, "Pending tasks:  12\n"}, // a coordinator from before pending_revision
	} {
		var out bytes.Buffer
		printRegionStatus(&out, &apiaryv1.GetRegionInfoResponse{Region: "r", PendingTasks: c.pending, Revision: c.rev, PendingRevision: c.pendRev}, nil)
		if !strings.Contains(out.String(), c.want) {
			t.Fatalf("pending %d at %d of %d: no line %q in\n%s", c.pending, c.pendRev, c.rev, c.want, out.String())
		}
	}
}

// job list refuses a page token that is no job id and a --limit outside
// 1..10000 before it dials (exit 2, the flag named).
func TestJobListRefusesBadPagingFlags(t *testing.T) {
	closed := closedAddr(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--page-token", "garbage"}, "--page-token must be the token a previous page printed"},
		{[]string{"--page-token", strings.Repeat("x", 300)}, "--page-token must be"},
		{[]string{"--limit", "0"}, "--limit must be between 1 and 10000 (got 0)"},
		{[]string{"--limit", "10001"}, "--limit must be between 1 and 10000"},
	} {
		r := runCLI(t, nil, append([]string{"job", "list", "--addr", closed}, c.args...)...)
		if r.code != exitInvalid || !strings.Contains(r.stderr, c.want) {
			t.Fatalf("job list %v: exit %d, stderr:\n%s\nwant exit %d and %q", c.args, r.code, r.stderr, exitInvalid, c.want)
		}
	}
	// A token of a job id's shape passes the check (and then fails to dial).
	r := runCLI(t, nil, "job", "list", "--addr", closed, "--page-token", "eu-west-06h3z3msn7jhge3tc3ej", "--timeout", "2s")
	if r.code == exitInvalid {
		t.Fatalf("a job id as page token refused: %s", r.stderr)
	}
}
