package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"apiary.dev/apiary/placement"
	"apiary.dev/apiary/placement/sim"
)

func init() { register(newPlacementCmd) }

func newPlacementCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "placement",
		Short: "Inspect the placement engine offline",
	}
	cmd.AddCommand(newPlacementSimulateCmd())
	return cmd
}

func newPlacementSimulateCmd() *cobra.Command {
	var (
		nodesPath, tasksPath, policies, seeds, output string
		arrival                                       float64
		candidates                                    int
		allNodes                                      bool
		fragModel                                     string
	)
	cmd := &cobra.Command{
		Use:   "simulate --nodes NODES.csv --tasks TASKS.csv",
		Short: "Replay a task trace onto a node list with the engine alone and compare policies",
		Long: `Replays TASKS.csv onto NODES.csv with the placement engine only (no cluster),
by the method of the FGD paper (USENIX ATC'23): the trace is shuffled per seed,
tasks drawn with replacement are appended until the GPU request reaches
--arrival percent of GPU capacity, each task gets one try and never leaves.
Prints per policy, as the mean over seeds, the GPU, CPU and memory allocation
when the arrived GPU demand reaches 100% of capacity, the GPU fragmentation
at that point, and placements per second.

CSV columns are those of the Alibaba GPU trace (cluster-trace-gpu-v2023):
nodes sn,cpu_milli,memory_mib,gpu,model; tasks name,cpu_milli,memory_mib,
num_gpu,gpu_milli and, optionally, gpu_spec (allowed GPU models; absent in the
trace's multigpu and gpushare lists). Other columns are ignored and may be
absent. A file without a required column exits 2, naming the file and column.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if nodesPath == "" || tasksPath == "" {
				return withCode(exitInvalid, fmt.Errorf("--nodes and --tasks are required"))
			}
			pols, err := sim.ParsePolicies(policies)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			sds, err := sim.ParseSeeds(seeds)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			if arrival < 100 || arrival > 1000 {
				return withCode(exitInvalid, fmt.Errorf("--arrival %g out of range 100..1000", arrival))
			}
			if candidates < -1 {
				return withCode(exitInvalid, fmt.Errorf("--candidates %d: want -1 (score every feasible node), 0 (the engine default, %d) or a positive count", candidates, placement.DefaultCandidateLimit))
			}
			if output != "text" && output != "json" {
				return withCode(exitInvalid, fmt.Errorf("--output %q: want text or json", output))
			}
			fm := placement.FragModel(fragModel)
			switch fm {
			case placement.FragModelHybrid, placement.FragModelFGD, placement.FragModelFill:
			default:
				return withCode(exitInvalid, fmt.Errorf("--frag-model %q: want hybrid, fgd or fill", fragModel))
			}
			nodes, err := readTraceFile("--nodes", nodesPath, sim.ReadNodes)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			tasks, err := readTraceFile("--tasks", tasksPath, sim.ReadTasks)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			if !allNodes {
				nodes = sim.GPUNodes(nodes)
			}
			if len(nodes) == 0 || len(tasks) == 0 {
				return withCode(exitInvalid, fmt.Errorf("nothing to simulate: %d nodes, %d tasks", len(nodes), len(tasks)))
			}
			res := sim.Compare(nodes, tasks, pols, sds, sim.Config{ArrivalPct: arrival, CandidateLimit: candidates, FragModel: fm})
			out := cmd.OutOrStdout()
			if output == "json" {
				doc := struct {
					Policies map[placement.Policy]sim.Summary `json:"policies"`
				}{res}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(doc)
			}
			fmt.Fprintf(out, "%d nodes, %d trace tasks, seeds %s (n=%d), arrival %g%%\n", len(nodes), len(tasks), seeds, len(sds), arrival)
			fmt.Fprintf(out, "%-14s %10s %8s %13s %8s %8s %8s %12s\n", "policy", "gpu%@100", "±sd", "min-max", "cpu%", "mem%", "frag%", "placements/s")
			for _, p := range pols {
				s := res[p]
				sd := "-" // undefined for one seed
				if s.N > 1 {
					sd = fmt.Sprintf("%.2f", s.GPUAllocStd)
				}
				fmt.Fprintf(out, "%-14s %10.2f %8s %13s %8.2f %8.2f %8.2f %12.0f\n", p, s.GPUAllocPctAt100, sd,
					fmt.Sprintf("%.2f-%.2f", s.GPUAllocMin, s.GPUAllocMax), s.CPUAllocPctAt100, s.MemAllocPctAt100, s.FragGPUPctAt100, s.PlacementsPerSec)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&nodesPath, "nodes", "", "node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
	f.StringVar(&tasksPath, "tasks", "", "task list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec],...)")
	f.StringVar(&policies, "policy", "all", "policies: all, or a comma list of random,spread,binpack,bestfit,fragmentation")
	f.StringVar(&seeds, "seeds", "42-51", "seeds: a range 42-51 or a list 42,43")
	f.Float64Var(&arrival, "arrival", 130, "total GPU request replayed, percent of GPU capacity")
	f.StringVar(&output, "output", "text", "text or json")
	f.IntVar(&candidates, "candidates", -1, "feasible nodes scored per task (-1: all, the published method; 0: the engine default, 64)")
	f.BoolVar(&allNodes, "all-nodes", false, "also simulate nodes without GPUs (default: GPU nodes only, as published)")
	f.StringVar(&fragModel, "frag-model", string(placement.FragModelHybrid), "fragmentation measure of the fragmentation policy: hybrid, fgd or fill")
	return cmd
}

// readTraceFile opens the file a flag names and parses it with read (one of
// placement/sim's CSV readers). Errors name the flag, then the file and the
// line.
func readTraceFile[T any](flag, path string, read func(io.Reader) (T, error)) (T, error) {
	f, err := os.Open(path)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s: %w", flag, err)
	}
	defer f.Close()
	v, err := read(f)
	if err != nil {
		return v, fmt.Errorf("%s: %s: %w", flag, path, err)
	}
	return v, nil
}
