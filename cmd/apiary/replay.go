package main

// apiary demo-replay (hidden): replays the first N pods of an Alibaba GPU
// trace (cluster-trace-gpu-v2023, openb_pod_list_*.csv) as jobs through the
// API (the global router in `make demo`), each pod one task that really runs
// `sleep` for its scaled lifetime, then prints a summary table.

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/lifecycle"
)

func init() { register(newReplayCmd) }

type tracePod struct {
	name           string
	cpu, mem, gpus int64
	qos            string
	create, delete int64 // seconds from trace start
}

func readTracePods(path string, n int) ([]tracePod, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	head, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[h] = i
	}
	for _, c := range []string{"name", "cpu_milli", "memory_mib", "num_gpu", "qos", "creation_time", "deletion_time"} {
		if _, ok := col[c]; !ok {
			return nil, fmt.Errorf("%s: column %q is missing", path, c)
		}
	}
	var out []tracePod
	for len(out) < n {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		num := func(c string) int64 { v, _ := strconv.ParseInt(rec[col[c]], 10, 64); return v }
		p := tracePod{name: rec[col["name"]], cpu: num("cpu_milli"), mem: num("memory_mib"), gpus: num("num_gpu"),
			qos: rec[col["qos"]], create: num("creation_time"), delete: num("deletion_time")}
		if p.delete < p.create {
			p.delete = p.create
		}
		out = append(out, p)
	}
	return out, nil
}

type replayResult struct {
	pod      tracePod
	jobID    string
	region   string
	refused  string
	state    apiaryv1.JobState
	latency  time.Duration // submit → first attempt start
	hasStart bool
}

func newReplayCmd() *cobra.Command {
	o := &clientOpts{}
	var (
		trace     string
		n         int
		span      time.Duration
		agentCPU  int64
		agentMem  int64
		waitLimit time.Duration
	)
	cmd := &cobra.Command{
		Use:    "demo-replay",
		Hidden: true,
		Short:  "Replay the first N pods of an Alibaba GPU trace as sleep jobs and summarise",
		Long: `Replay trace pods as jobs. Times are scaled by one factor so that the last
pod's deletion time maps to --span: a pod arrives at its scaled creation time
and its task sleeps for its scaled lifetime (at least 50 ms). CPU and memory
are scaled so the trace's largest request takes half of one dev agent
(--agent-cpu-millis, --agent-memory-mb); GPUs are dropped (dev agents have
none). QoS maps to priority (Guaranteed 80, LS 60 with jurisdiction eu and
data class personal, Burstable 50, BE 20).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			pods, err := readTracePods(trace, n)
			if err != nil {
				return withCode(exitInvalid, err)
			}
			if len(pods) == 0 {
				return withCode(exitInvalid, fmt.Errorf("--trace: no pods in %s", trace))
			}
			var maxCPU, maxMem, minCreate, maxDelete int64 = 1, 1, pods[0].create, 1
			for _, p := range pods {
				maxCPU, maxMem = max(maxCPU, p.cpu), max(maxMem, p.mem)
				minCreate, maxDelete = min(minCreate, p.create), max(maxDelete, p.delete)
			}
			timeScale := span.Seconds() / float64(max(maxDelete-minCreate, 1))
			cc, addr, err := o.conn(cmd)
			if err != nil {
				return err
			}
			defer cc.Close()
			client := apiaryv1.NewJobServiceClient(cc)
			ctx, stop := signalContext(cmd)
			defer stop()
			errw := cmd.ErrOrStderr()
			fmt.Fprintf(errw, "replaying %d pods of %s through %s: time x%.2g (ends by ~%s), cpu x%.3g, memory x%.3g\n",
				len(pods), trace, addr, timeScale, span, float64(agentCPU/2)/float64(maxCPU), float64(agentMem/2)/float64(maxMem))
			results := make([]*replayResult, len(pods))
			start := time.Now()
			var wg sync.WaitGroup
			for i, p := range pods {
				res := &replayResult{pod: p}
				results[i] = res
				at := time.Duration(float64(p.create-minCreate) * timeScale * float64(time.Second))
				life := max(time.Duration(float64(p.delete-p.create)*timeScale*float64(time.Second)), 50*time.Millisecond)
				spec := &apiaryv1.JobSpec{Name: p.name, Priority: 50, Tasks: []*apiaryv1.TaskGroup{{
					Name: "pod", Count: 1, Command: "sleep", Args: []string{fmt.Sprintf("%.3f", life.Seconds())},
					Resources: &apiaryv1.Resources{CpuMillis: max(p.cpu*(agentCPU/2)/maxCPU, 10), MemoryMb: max(p.mem*(agentMem/2)/maxMem, 16)},
				}}}
				switch p.qos {
				case "Guaranteed":
					spec.Priority = 80
				case "LS":
					spec.Priority, spec.Jurisdiction, spec.DataClass = 60, "eu", "personal"
				case "BE":
					spec.Priority = 20
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if lifecycle.Sleep(ctx, time.Until(start.Add(at))) != nil {
						return
					}
					req := &apiaryv1.SubmitJobRequest{Spec: spec, ClientId: "demo-replay", RequestId: fmt.Sprintf("%s-%d", p.name, start.UnixNano())}
					var resp *apiaryv1.SubmitJobResponse
					err := o.call(ctx, func(ctx context.Context) error {
						var err error
						resp, err = client.SubmitJob(ctx, req)
						return err
					})
					if err != nil {
						res.refused = fmt.Sprintf("%s: %s", status.Code(err), replayFirstLine(status.Convert(err).Message()))
						return
					}
					res.jobID, res.region = resp.GetJobId(), resp.GetRegion()
				}()
			}
			wg.Wait()
			fmt.Fprintf(errw, "all %d submitted after %s; waiting for the jobs to end (at most %s)\n", len(pods), time.Since(start).Round(time.Millisecond), waitLimit)
			deadline := time.Now().Add(waitLimit)
			for ctx.Err() == nil && time.Now().Before(deadline) {
				open := 0
				var mu sync.Mutex
				sem := make(chan struct{}, 8)
				for _, r := range results {
					if r.jobID == "" || terminal(r.state) {
						continue
					}
					wg.Add(1)
					sem <- struct{}{}
					go func() {
						defer wg.Done()
						defer func() { <-sem }()
						cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
						defer cancel()
						g, err := client.GetJob(cctx, &apiaryv1.GetJobRequest{JobId: r.jobID})
						if err != nil {
							mu.Lock()
							open++
							mu.Unlock()
							return
						}
						j := g.GetJob()
						r.state = j.GetState()
						for _, t := range j.GetTasks() {
							if as := t.GetAttempts(); len(as) > 0 && as[0].GetStartTimeMs() > 0 {
								r.latency = time.Duration(as[0].GetStartTimeMs()-j.GetSubmitTimeMs()) * time.Millisecond
								r.hasStart = true
							}
						}
						if !terminal(r.state) {
							mu.Lock()
							open++
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				if open == 0 {
					break
				}
				_ = lifecycle.Sleep(ctx, time.Second)
			}
			printReplaySummary(cmd.OutOrStdout(), results, time.Since(start))
			return nil
		},
	}
	o.addFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&trace, "trace", "../shared/traces/alibaba-gpu-v2023/openb_pod_list_default.csv", "pod list CSV of cluster-trace-gpu-v2023")
	f.IntVar(&n, "n", 300, "replay the first N pods")
	f.DurationVar(&span, "span", 50*time.Second, "scaled time of the last pod's deletion")
	f.Int64Var(&agentCPU, "agent-cpu-millis", 4000, "CPU of one dev agent (millicores); the largest pod gets half")
	f.Int64Var(&agentMem, "agent-memory-mb", 8192, "memory of one dev agent (MiB); the largest pod gets half")
	f.DurationVar(&waitLimit, "wait-limit", 90*time.Second, "stop waiting for jobs to end after this long")
	return cmd
}

func replayFirstLine(s string) string {
	for i, c := range s {
		if c == '\n' {
			return s[:i]
		}
	}
	return s
}

func pctl(ds []time.Duration, p float64) string {
	if len(ds) == 0 {
		return "-"
	}
	sort.Slice(ds, func(a, b int) bool { return ds[a] < ds[b] })
	i := int(float64(len(ds)-1) * p)
	return ds[i].Round(time.Millisecond).String()
}

func printReplaySummary(w io.Writer, results []*replayResult, took time.Duration) {
	type row struct {
		submitted, completed, failed, other int
		lat                                 []time.Duration
	}
	rows := map[string]*row{}
	total := &row{}
	refused := map[string]int{}
	for _, r := range results {
		if r.jobID == "" {
			if r.refused == "" {
				r.refused = "not submitted (interrupted)"
			}
			refused[r.refused]++
			continue
		}
		x := rows[r.region]
		if x == nil {
			x = &row{}
			rows[r.region] = x
		}
		for _, y := range []*row{x, total} {
			y.submitted++
			switch r.state {
			case apiaryv1.JobState_JOB_STATE_COMPLETE:
				y.completed++
			case apiaryv1.JobState_JOB_STATE_FAILED, apiaryv1.JobState_JOB_STATE_CANCELLED:
				y.failed++
			default:
				y.other++
			}
			if r.hasStart {
				y.lat = append(y.lat, r.latency)
			}
		}
	}
	nref := 0
	for _, c := range refused {
		nref += c
	}
	fmt.Fprintf(w, "\ntrace replay: %d pods in %s\n", len(results), took.Round(100*time.Millisecond))
	t := newTable(w)
	fmt.Fprintln(t, "REGION\tSUBMITTED\tCOMPLETED\tFAILED\tUNFINISHED\tREFUSED\tSUBMIT->START p50\tp99")
	names := make([]string, 0, len(rows))
	for k := range rows {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		x := rows[k]
		fmt.Fprintf(t, "%s\t%d\t%d\t%d\t%d\t-\t%s\t%s\n", k, x.submitted, x.completed, x.failed, x.other, pctl(x.lat, 0.5), pctl(x.lat, 0.99))
	}
	fmt.Fprintf(t, "all\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", total.submitted, total.completed, total.failed, total.other, nref, pctl(total.lat, 0.5), pctl(total.lat, 0.99))
	t.Flush()
	for why, c := range refused {
		fmt.Fprintf(w, "refused x%d: %s\n", c, cell(why, 200))
	}
	fmt.Fprintln(w, "(submit->start: job submit time to the first attempt's process start on an agent; placement + dispatch + fork)")
}
