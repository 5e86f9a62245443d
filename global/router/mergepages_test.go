package router

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// fakeRegionList pages a region's jobs as a coordinator does: ids below
// the token, newest first, only those keep allows, at most limit of them,
// and (as a coordinator whose job index lags does) a page ends early with
// the last id looked at once budget jobs were looked at.
func fakeRegionList(ids []string, keep func(string) bool, token string, limit, budget int) *apiaryv1.ListJobsResponse {
	out := &apiaryv1.ListJobsResponse{}
	looked := 0
	for i, id := range ids { // ids sorted descending
		if token != "" && id >= token {
			continue
		}
		if len(out.Jobs) == limit {
			out.NextPageToken = out.Jobs[limit-1].GetId()
			return out
		}
		if looked == budget {
			out.NextPageToken = ids[i-1]
			return out
		}
		looked++
		if keep(id) {
			out.Jobs = append(out.Jobs, &apiaryv1.Job{Id: id})
		}
	}
	return out
}

// TestMergeJobPagesMissesNothing: a federation list walked through
// mergeJobPages to the end lists every matching job of every region once,
// newest first, when regions end pages early (with no job at all, or a
// few) as well as when they fill them; page sizes from 1 up.
func TestMergeJobPagesMissesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	for trial := range 300 {
		var regions [][]string
		var want []string
		keep := func(id string) bool { return id[len(id)-1]%3 != 0 }
		for r := range 1 + rng.IntN(4) {
			var ids []string
			for range rng.IntN(40) {
				ids = append(ids, fmt.Sprintf("r%d-%05d", r, rng.IntN(100000)))
			}
			slices.Sort(ids)
			ids = slices.Compact(ids)
			slices.Reverse(ids)
			regions = append(regions, ids)
			for _, id := range ids {
				if keep(id) {
					want = append(want, id)
				}
			}
		}
		sort.Sort(sort.Reverse(sort.StringSlice(want)))
		limit, budget := 1+rng.IntN(10), 1+rng.IntN(12)
		var got []string
		token := ""
		for pages := 0; ; pages++ {
			if pages > 1000 {
				t.Fatalf("trial %d: no end after 1000 pages", trial)
			}
			var answers []*apiaryv1.ListJobsResponse
			for _, ids := range regions {
				answers = append(answers, fakeRegionList(ids, keep, token, limit, budget))
			}
			page := mergeJobPages(answers, limit)
			if len(page.GetJobs()) > limit {
				t.Fatalf("trial %d: a page of %d jobs, limit %d", trial, len(page.GetJobs()), limit)
			}
			for _, j := range page.GetJobs() {
				got = append(got, j.GetId())
			}
			if token = page.GetNextPageToken(); token == "" {
				break
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d (limit %d, budget %d): listed\n%v\nwant\n%v", trial, limit, budget, got, want)
		}
	}
}
