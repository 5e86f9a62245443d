package sim

import (
	"fmt"
	"slices"
	"testing"

	"apiary.dev/apiary/placement"
)

// bestFitGPUs packs GPU shares (milli, < 1000) online in the given order by
// best fit: each share goes to the GPU with the least free milli that holds
// it, or to a new GPU. It returns the number of GPUs used. CPU and memory
// are ignored.
func bestFitGPUs(shares []int) int {
	var free []int
	for _, x := range shares {
		best := -1
		for g, f := range free {
			if f >= x && (best < 0 || f < free[best]) {
				best = g
			}
		}
		if best < 0 {
			free = append(free, 1000-x)
			continue
		}
		free[best] -= x
	}
	return len(free)
}

// bestFitDecreasingGPUs is bestFitGPUs over the shares sorted largest
// first: the offline reference (it sees every share before placing any).
func bestFitDecreasingGPUs(shares []int) int {
	s := slices.Clone(shares)
	slices.SortFunc(s, func(a, b int) int { return b - a })
	return bestFitGPUs(s)
}

func TestBestFitGPUs(t *testing.T) {
	// Online: 320 opens a GPU, 470 joins it (210 left), 650 opens a second,
	// the last 470 a third. Offline: 650+320 and 470+470 fill two.
	shares := []int{320, 470, 650, 470}
	if got := bestFitGPUs(shares); got != 3 {
		t.Fatalf("online best fit: %d GPUs, want 3", got)
	}
	if got := bestFitDecreasingGPUs(shares); got != 2 {
		t.Fatalf("best fit decreasing: %d GPUs, want 2", got)
	}
	if got := bestFitGPUs([]int{810, 160, 110}); got != 2 {
		t.Fatalf("810+160 then 110: %d GPUs, want 2", got)
	}
}

// BenchmarkSharePacking measures how far the fragmentation policy is from
// the best possible packing of GPU shares on the default trace (method of
// BenchmarkQuality, full scan). At 100% arrival no GPU, or one, is idle any
// more, and the free GPU capacity is (all but) the unused remainder of the
// GPUs that hold shares, so the GPU allocation can only rise by packing the
// same shares into fewer GPUs. Per seed it compares the GPUs the policy filled
// with shares by then against (a) online best fit of the same shares in the
// same order, CPU and memory ignored, and (b) offline best fit decreasing
// of them. Reported: means over seeds, in GPUs and in points of the
// cluster's GPU capacity (a gain > 0: the reference packs them into fewer
// GPUs than the policy did; < 0: the policy packs them tighter).
// go test ./placement/sim -run '^$' -bench SharePacking -benchtime 1x
func BenchmarkSharePacking(b *testing.B) {
	seeds := benchSeeds(b)
	nodes, tasks := load(b, "openb_pod_list_default.csv")
	var ours, online, offline, alloc float64
	for i := 0; i < b.N; i++ {
		ours, online, offline, alloc = 0, 0, 0, 0
		for _, seed := range seeds {
			var shares []int
			gpus := map[string]bool{}
			done := false
			res := Run(nodes, tasks, Config{Policy: placement.PolicyFragmentation, Seed: seed, CandidateLimit: -1,
				Observe: func(t *placement.Task, r placement.Result, arrived, capMilli int64) {
					if done {
						return
					}
					if r.Placement != nil && t.Request.GPUMilli > 0 && t.Request.GPUMilli < 1000 && t.Request.GPUs == 0 {
						shares = append(shares, t.Request.GPUMilli)
						gpus[fmt.Sprintf("%s/%d", r.Placement.NodeID, r.Placement.GPUIndices[0])] = true
					}
					done = arrived >= capMilli
				}})
			on, off := bestFitGPUs(shares), bestFitDecreasingGPUs(shares)
			sum := 0
			for _, x := range shares {
				sum += x
			}
			var capMilli float64
			for _, nd := range nodes {
				capMilli += float64(nd.Capacity.GPUs) * 1000
			}
			b.Logf("seed %d: gpu alloc %.2f%% (free %.0f milli; unused remainder of the share GPUs %d milli), %d shares on %d GPUs; online best fit %d, offline best fit decreasing %d",
				seed, res.GPUAllocPctAt100, (100-res.GPUAllocPctAt100)/100*capMilli, len(gpus)*1000-sum, len(shares), len(gpus), on, off)
			ours += float64(len(gpus))
			online += float64(on)
			offline += float64(off)
			alloc += res.GPUAllocPctAt100
		}
	}
	n := float64(len(seeds))
	var capGPUs float64
	for _, nd := range nodes {
		capGPUs += float64(nd.Capacity.GPUs)
	}
	b.ReportMetric(alloc/n, "gpu_alloc_%")
	b.ReportMetric(ours/n, "share_gpus")
	b.ReportMetric(online/n, "online_bestfit_gpus")
	b.ReportMetric(offline/n, "offline_bfd_gpus")
	b.ReportMetric(100*(ours-offline)/n/capGPUs, "offline_gain_pts")
	b.ReportMetric(100*(ours-online)/n/capGPUs, "online_bestfit_gain_pts")
}
