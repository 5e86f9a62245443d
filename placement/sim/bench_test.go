package sim

import (
	"fmt"
	"os"
	"testing"

	"apiary.dev/apiary/placement"
)

// benchSeeds is the seed list of the trace benchmarks: APIARY_BENCH_SEEDS
// (as for --seeds), default 42-51.
func benchSeeds(b *testing.B) []int64 {
	spec := os.Getenv("APIARY_BENCH_SEEDS")
	if spec == "" {
		spec = "42-51"
	}
	seeds, err := ParseSeeds(spec)
	if err != nil {
		b.Fatal(err)
	}
	return seeds
}

// BenchmarkQuality is benchmark 1 of issue 3: GPU allocation at 100% arrival
// on the Alibaba trace, per policy, mean over seeds (APIARY_BENCH_SEEDS,
// default 42-51), for both task files; fragmentation also with bounded
// candidate scans and with the published FGD measure. Run it once:
// go test ./placement/sim -run XXX -bench Quality -benchtime 1x.
func BenchmarkQuality(b *testing.B) {
	seeds := benchSeeds(b)
	type variant struct {
		name  string
		pol   placement.Policy
		limit int
		fm    placement.FragModel
		sw    float64 // ScarcityWeight (0 = default)
		pw    float64 // PackingWeight (0 = default)
	}
	vs := []variant{
		{"random", placement.PolicyRandom, -1, "", 0, 0},
		{"spread", placement.PolicySpread, -1, "", 0, 0},
		{"binpack", placement.PolicyBinpack, -1, "", 0, 0},
		{"bestfit", placement.PolicyBestFit, -1, "", 0, 0},
		{"fgd-published-measure", placement.PolicyFragmentation, -1, placement.FragModelFGD, 0, 0},
		{"fragmentation", placement.PolicyFragmentation, -1, "", 0, 0},
		{"fragmentation-nopacking", placement.PolicyFragmentation, -1, "", 0, -1},
		{"fragmentation-noscarcity", placement.PolicyFragmentation, -1, "", -1, 0},
		{"fragmentation-limit256", placement.PolicyFragmentation, 256, "", 0, 0},
		{"fragmentation-limit64", placement.PolicyFragmentation, 64, "", 0, 0},
		{"fragmentation-limit16", placement.PolicyFragmentation, 16, "", 0, 0},
	}
	for _, file := range []string{"openb_pod_list_default.csv", "openb_pod_list_gpuspec33.csv"} {
		nodes, tasks := load(b, file)
		for _, v := range vs {
			if v.sw < 0 && file == "openb_pod_list_default.csv" {
				continue // no GPU-model constraints: the charge is 0 everywhere
			}
			b.Run(fmt.Sprintf("trace=%s/policy=%s", file[len("openb_pod_list_"):len(file)-4], v.name), func(b *testing.B) {
				var s Summary
				for i := 0; i < b.N; i++ {
					var runs []Result
					for _, seed := range seeds {
						runs = append(runs, Run(nodes, tasks, Config{Policy: v.pol, Seed: seed, CandidateLimit: v.limit, FragModel: v.fm, ScarcityWeight: v.sw, PackingWeight: v.pw}))
					}
					s = Summarize(runs)
				}
				reportSummary(b, s)
			})
		}
	}
}

// BenchmarkPackingWeight is the sweep that chose DefaultPackingWeight: the
// fragmentation policy (full scan) on both task files at packing weights
// off, 3, 10, 20, 30 and 1000, on seeds disjoint from the reported 42-51
// (APIARY_BENCH_SEEDS, default here 52-61). Run it once:
// go test ./placement/sim -run '^$' -bench PackingWeight -benchtime 1x.
func BenchmarkPackingWeight(b *testing.B) {
	if os.Getenv("APIARY_BENCH_SEEDS") == "" {
		b.Setenv("APIARY_BENCH_SEEDS", "52-61")
	}
	seeds := benchSeeds(b)
	for _, file := range []string{"openb_pod_list_default.csv", "openb_pod_list_gpuspec33.csv"} {
		nodes, tasks := load(b, file)
		for _, w := range []float64{-1, 3, 10, 20, 30, 1000} {
			b.Run(fmt.Sprintf("trace=%s/weight=%g", file[len("openb_pod_list_"):len(file)-4], w), func(b *testing.B) {
				var s Summary
				for i := 0; i < b.N; i++ {
					var runs []Result
					for _, seed := range seeds {
						runs = append(runs, Run(nodes, tasks, Config{Policy: placement.PolicyFragmentation, Seed: seed, PackingWeight: w}))
					}
					s = Summarize(runs)
				}
				reportSummary(b, s)
			})
		}
	}
}

// reportSummary reports a Summary as benchmark metrics.
func reportSummary(b *testing.B, s Summary) {
	b.ReportMetric(s.GPUAllocPctAt100, "gpu_alloc_%")
	b.ReportMetric(s.GPUAllocStd, "gpu_alloc_sd")
	b.ReportMetric(s.GPUAllocMin, "gpu_alloc_min")
	b.ReportMetric(s.GPUAllocMax, "gpu_alloc_max")
	b.ReportMetric(s.CPUAllocPctAt100, "cpu_alloc_%")
	b.ReportMetric(s.MemAllocPctAt100, "mem_alloc_%")
	b.ReportMetric(s.FragGPUPctAt100, "frag_gpu_%")
	b.ReportMetric(s.PlacementsPerSec, "placements/s")
	b.ReportMetric(float64(s.N), "seeds")
}
