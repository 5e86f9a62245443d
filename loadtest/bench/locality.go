package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
)

// The data-locality benchmark (issue 13 (b), `make bench-placement`): how
// many input bytes stage-2 tasks would have to fetch with the placement's
// data-locality score on (`apiary region --locality-weight 1`, the
// default) and off (-1), on a generated two-stage workload
// (examples/two-stage.yaml's shape).
//
// A run: a fresh one-coordinator region of Agents agents with the mode's
// weight; Jobs jobs submitted at once, each of one `produce` task that
// writes DatasetMiB MiB to $APIARY_OUTPUT_DIR/d<j> (outputs: [d<j>]) and
// Readers `consume` tasks after it (after: [produce], datasets: [{name:
// d<j>}]) that only check whether the dataset is on their node. Moved
// bytes: the sum of the consume tasks' fetch_bytes (GetJob: the input bytes
// their node did not hold when placed), over their total input bytes (each
// one's dataset at its size on the node holding it, ListNodes). Modes
// alternate run by run.

// Modes of a locality run.
const (
	LocalityOn  = "on"
	LocalityOff = "off"
)

// localityWeight is the --locality-weight of a mode.
func localityWeight(mode string) string {
	if mode == LocalityOff {
		return "-1"
	}
	return "1"
}

// localityOrder is the modes of runs rounds, alternating with the order
// swapped every round (on, off, off, on, ...).
func localityOrder(runs int) []string {
	var out []string
	for i := 0; i < runs; i++ {
		if i%2 == 0 {
			out = append(out, LocalityOn, LocalityOff)
		} else {
			out = append(out, LocalityOff, LocalityOn)
		}
	}
	return out
}

// LocalityOptions configures the locality benchmark.
type LocalityOptions struct {
	// Runs per mode (on, off), alternating, a fresh region each.
	Runs int
	// Agents of CPUMillis / MemoryMiB each (no --max-tasks limit).
	Agents               int
	CPUMillis, MemoryMiB int64
	// Jobs submitted at once, each of one produce task and Readers consume
	// tasks; each produce task writes DatasetMiB MiB.
	Jobs       int
	Readers    int32
	DatasetMiB int
	// TaskCPUMillis / TaskMemoryMiB of every task.
	TaskCPUMillis, TaskMemoryMiB int64
	// Scheduler is the jobs' placement policy ("spread": the produce tasks
	// land on different nodes, so the datasets do).
	Scheduler string
	// ExtraArgs are added to `apiary region` after --locality-weight.
	ExtraArgs []string
	// Timeout bounds one run from the submission until every task is
	// terminal.
	Timeout time.Duration
}

// DefaultLocality: 4 agents x 1000 m / 1024 MiB, 8 jobs x (1 producer of
// 4 MiB + 3 readers), tasks of 100 m / 32 MiB, spread, 10 runs per mode
// (about 5 s each).
var DefaultLocality = LocalityOptions{Runs: 10, Agents: 4, CPUMillis: 1000, MemoryMiB: 1024, Jobs: 8, Readers: 3, DatasetMiB: 4,
	TaskCPUMillis: 100, TaskMemoryMiB: 32, Scheduler: "spread", Timeout: 120 * time.Second}

// LocalityTask is one consume task of a run.
type LocalityTask struct {
	Job     string
	Index   int32
	Dataset string
	Node    string
	State   string
	// InputBytes: its dataset's size (the largest copy ListNodes shows);
	// FetchBytes: GetJob's fetch_bytes.
	InputBytes, FetchBytes int64
	// Holders: the nodes that hold the dataset (ListNodes, after the run).
	Holders []string
	// SaidLocal: the task's stdout says it found the dataset on its node
	// (APIARY_DATASET_<NAME> set and the file there).
	SaidLocal bool
}

// LocalityRun is one run.
type LocalityRun struct {
	Mode      string
	Run, Seq  int
	Jobs      int
	Stage2    int
	Failed    int
	Producers []string // node of each produce task, by job
	// InputBytes and FetchBytes summed over the consume tasks.
	InputBytes, FetchBytes int64
	// LocalFetch: consume tasks with fetch_bytes 0; LocalHolder: on a node
	// holding their dataset; SaidLocal: whose output said so.
	LocalFetch, LocalHolder, SaidLocal int
	// WallMs: the submission until the last task terminal (watch).
	WallMs float64
	Tasks  []LocalityTask
	Err    string
}

// Fraction is FetchBytes / InputBytes (0 without input).
func (r LocalityRun) Fraction() float64 {
	if r.InputBytes == 0 {
		return 0
	}
	return float64(r.FetchBytes) / float64(r.InputBytes)
}

// datasetName is the dataset of job j (0-based): d1, d2, ...
func datasetName(j int) string { return fmt.Sprintf("d%d", j+1) }

// twoStageJob is job j of the workload: produce writes the dataset,
// consume reads it after.
func twoStageJob(o LocalityOptions, j int) *apiaryv1.JobSpec {
	d := datasetName(j)
	env := "APIARY_DATASET_" + strings.ToUpper(d)
	res := &apiaryv1.Resources{CpuMillis: o.TaskCPUMillis, MemoryMb: o.TaskMemoryMiB}
	produce := fmt.Sprintf(`mkdir -p "$APIARY_OUTPUT_DIR/%s" && head -c %d /dev/zero > "$APIARY_OUTPUT_DIR/%s/part-0"`, d, int64(o.DatasetMiB)<<20, d)
	consume := fmt.Sprintf(`p="${%s:-}"; if [ -n "$p" ] && [ -f "$p/part-0" ]; then echo "local $(wc -c < "$p/part-0")"; else echo remote; fi`, env)
	return &apiaryv1.JobSpec{Name: "two-stage-" + d, Scheduler: o.Scheduler, Tasks: []*apiaryv1.TaskGroup{
		{Name: "produce", Count: 1, Command: "sh", Args: []string{"-c", produce}, Resources: res, Outputs: []string{d}},
		{Name: "consume", Count: o.Readers, Command: "sh", Args: []string{"-c", consume}, Resources: res,
			After: []string{"produce"}, Datasets: []*apiaryv1.Dataset{{Name: d}}},
	}}
}

// tallyLocality fills the run's sums from its tasks.
func tallyLocality(r *LocalityRun) {
	r.Stage2, r.InputBytes, r.FetchBytes, r.LocalFetch, r.LocalHolder, r.SaidLocal = len(r.Tasks), 0, 0, 0, 0, 0
	for _, t := range r.Tasks {
		r.InputBytes += t.InputBytes
		r.FetchBytes += t.FetchBytes
		if t.FetchBytes == 0 {
			r.LocalFetch++
		}
		if slices.Contains(t.Holders, t.Node) {
			r.LocalHolder++
		}
		if t.SaidLocal {
			r.SaidLocal++
		}
	}
}

// Locality runs one run of mode on a fresh region.
func Locality(ctx context.Context, cfg Config, o LocalityOptions, mode string, run, seq int) (LocalityRun, error) {
	res := LocalityRun{Mode: mode, Run: run, Seq: seq, Jobs: o.Jobs}
	var agents []devcluster.AgentSpec
	for i := 0; i < o.Agents; i++ {
		agents = append(agents, devcluster.AgentSpec{ID: fmt.Sprintf("agent-%d", i+1), CPUMillis: o.CPUMillis, MemoryMiB: o.MemoryMiB})
	}
	args := append([]string{"--locality-weight=" + localityWeight(mode)}, o.ExtraArgs...)
	dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("locality-%s-%d", mode, run))
	cl, r, err := startRegionSpec(ctx, cfg, dir, devcluster.RegionSpec{Coordinators: 1, Agents: agents, ExtraArgs: args}, nil)
	if err != nil {
		return res, err
	}
	defer cl.Stop()
	if err := r.WaitNodes(ctx, o.Agents); err != nil {
		return res, err
	}
	conn, err := r.Dial()
	if err != nil {
		return res, err
	}
	defer conn.Close()
	js := apiaryv1.NewJobServiceClient(conn)
	admin := apiaryv1.NewAdminServiceClient(conn)
	cli, err := etcdClient(r.EtcdEndpoints)
	if err != nil {
		return res, err
	}
	defer cli.Close()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	tw, err := startTaskWatch(wctx, cli)
	if err != nil {
		return res, err
	}

	t0 := time.Now()
	ids, err := submitAll(ctx, js, o.Jobs, "bench-locality", func(j int) (*apiaryv1.JobSpec, string) {
		return twoStageJob(o, j), fmt.Sprintf("%s-%d-j%d-%d", mode, run, j, t0.UnixNano())
	})
	if err != nil {
		return res, err
	}
	per := 1 + int(o.Readers)
	terminal := []apiaryv1.TaskState{apiaryv1.TaskState_TASK_STATE_COMPLETE, apiaryv1.TaskState_TASK_STATE_FAILED, apiaryv1.TaskState_TASK_STATE_CANCELLED}
	if err := waitFor(ctx, o.Timeout, "every task terminal", func() (bool, error) {
		if err := tw.failed(); err != nil {
			return false, err
		}
		done := 0
		for _, id := range ids {
			done += tw.count(id, terminal...)
		}
		return done == o.Jobs*per, fmt.Errorf("%d of %d tasks terminal", done, o.Jobs*per)
	}); err != nil {
		return res, err
	}
	var last time.Time
	for _, id := range ids {
		for i := 0; i < per; i++ {
			for _, s := range terminal {
				if at, ok := tw.firstIn(id, int32(i), s); ok && at.After(last) {
					last = at
				}
			}
		}
	}
	res.WallMs = sinceMs(t0, last)
	wcancel()

	// Who holds which dataset, at what size.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	nodes, err := admin.ListNodes(cctx, &apiaryv1.ListNodesRequest{})
	cancel()
	if err != nil {
		return res, fmt.Errorf("list nodes: %w", err)
	}
	holders, size := map[string][]string{}, map[string]int64{}
	for _, n := range nodes.GetNodes() {
		for _, d := range n.GetDatasets() {
			holders[d.GetName()] = append(holders[d.GetName()], n.GetId())
			size[d.GetName()] = max(size[d.GetName()], d.GetSizeBytes())
		}
	}
	for j, id := range ids {
		d := datasetName(j)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		g, err := js.GetJob(cctx, &apiaryv1.GetJobRequest{JobId: id})
		cancel()
		if err != nil {
			return res, fmt.Errorf("get job %s: %w", id, err)
		}
		cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		lg, err := js.GetJobLogs(cctx, &apiaryv1.GetJobLogsRequest{JobId: id, TaskIndex: -1})
		cancel()
		if err != nil {
			return res, fmt.Errorf("job logs %s: %w", id, err)
		}
		said := map[int32]bool{}
		for _, tk := range lg.GetTasks() {
			if a := tk.GetAttempts(); len(a) > 0 {
				said[tk.GetIndex()] = strings.HasPrefix(strings.TrimSpace(a[len(a)-1].GetStdoutTail()), "local ")
			}
		}
		for _, tk := range g.GetJob().GetTasks() {
			if tk.GetState() != apiaryv1.TaskState_TASK_STATE_COMPLETE {
				res.Failed++
			}
			if tk.GetGroup() == "produce" {
				res.Producers = append(res.Producers, tk.GetNodeId())
				continue
			}
			in := size[d]
			if in == 0 {
				in = int64(o.DatasetMiB) << 20 // no node holds it (its producer failed)
			}
			hs := slices.Clone(holders[d])
			slices.Sort(hs)
			res.Tasks = append(res.Tasks, LocalityTask{Job: id, Index: tk.GetIndex(), Dataset: d, Node: tk.GetNodeId(),
				State: strings.TrimPrefix(tk.GetState().String(), "TASK_STATE_"), InputBytes: in, FetchBytes: tk.GetFetchBytes(),
				Holders: hs, SaidLocal: said[tk.GetIndex()]})
		}
	}
	tallyLocality(&res)
	return res, nil
}

// LocalitySummary aggregates the finished runs of one mode.
type LocalitySummary struct {
	Mode      string
	N, Errors int
	// Pooled sums over the runs; Fraction their ratio.
	InputBytes, FetchBytes int64
	Fraction               float64
	// MovedMiB and Fractions per run.
	MovedMiB, Fractions Summary
	// Tasks and the local ones (by fetch_bytes, by holder, by their output).
	Tasks, LocalFetch, LocalHolder, SaidLocal, Failed int
	// Distinct nodes the producers ran on per run.
	ProducerNodes Summary
	Wall          Summary
}

// SummarizeLocality aggregates runs per mode (on, then off).
func SummarizeLocality(runs []LocalityRun) []LocalitySummary {
	var out []LocalitySummary
	for _, mode := range []string{LocalityOn, LocalityOff} {
		s := LocalitySummary{Mode: mode}
		var moved, fr, prod, wall []float64
		for _, r := range runs {
			if r.Mode != mode {
				continue
			}
			if r.Err != "" {
				s.Errors++
				continue
			}
			s.N++
			s.InputBytes += r.InputBytes
			s.FetchBytes += r.FetchBytes
			s.Tasks += r.Stage2
			s.LocalFetch += r.LocalFetch
			s.LocalHolder += r.LocalHolder
			s.SaidLocal += r.SaidLocal
			s.Failed += r.Failed
			moved = append(moved, float64(r.FetchBytes)/(1<<20))
			fr = append(fr, r.Fraction())
			distinct := slices.Compact(slices.Sorted(slices.Values(r.Producers)))
			prod = append(prod, float64(len(distinct)))
			wall = append(wall, r.WallMs)
		}
		if s.N == 0 && s.Errors == 0 {
			continue
		}
		if s.InputBytes > 0 {
			s.Fraction = float64(s.FetchBytes) / float64(s.InputBytes)
		}
		s.MovedMiB, s.Fractions, s.ProducerNodes, s.Wall = Summarize(moved), Summarize(fr), Summarize(prod), Summarize(wall)
		out = append(out, s)
	}
	return out
}

// LocalityRows is the per-run CSV (header, rows).
func LocalityRows(runs []LocalityRun) ([]string, [][]string) {
	header := []string{"mode", "run", "seq", "jobs", "stage2_tasks", "input_bytes", "fetch_bytes", "moved_fraction",
		"local_by_fetch_bytes", "local_by_holder", "said_local", "failed_tasks", "producer_nodes", "wall_ms", "error"}
	var rows [][]string
	for _, r := range runs {
		rows = append(rows, []string{r.Mode, strconv.Itoa(r.Run), strconv.Itoa(r.Seq), strconv.Itoa(r.Jobs), strconv.Itoa(r.Stage2),
			strconv.FormatInt(r.InputBytes, 10), strconv.FormatInt(r.FetchBytes, 10), strconv.FormatFloat(r.Fraction(), 'f', 4, 64),
			strconv.Itoa(r.LocalFetch), strconv.Itoa(r.LocalHolder), strconv.Itoa(r.SaidLocal), strconv.Itoa(r.Failed),
			strings.Join(r.Producers, " "), f1(r.WallMs), r.Err})
	}
	return header, rows
}

// LocalityTaskRows is the per-task CSV (header, rows).
func LocalityTaskRows(runs []LocalityRun) ([]string, [][]string) {
	header := []string{"mode", "run", "job", "task", "dataset", "node", "holders", "state", "input_bytes", "fetch_bytes", "said_local"}
	var rows [][]string
	for _, r := range runs {
		for _, t := range r.Tasks {
			rows = append(rows, []string{r.Mode, strconv.Itoa(r.Run), t.Job, strconv.Itoa(int(t.Index)), t.Dataset, t.Node,
				strings.Join(t.Holders, " "), t.State, strconv.FormatInt(t.InputBytes, 10), strconv.FormatInt(t.FetchBytes, 10), strconv.FormatBool(t.SaidLocal)})
		}
	}
	return header, rows
}

// LocalityMarkdown is the summary section.
func LocalityMarkdown(o LocalityOptions, sums []LocalitySummary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## locality\n\nA fresh 1-coordinator region per run, %d agents x %d m / %d MiB%s; %d jobs submitted at once (scheduler %q), each: 1 `produce` task writing %d MiB to $APIARY_OUTPUT_DIR/d<j> (outputs: [d<j>]), then %d `consume` tasks (after: [produce], datasets: [{name: d<j>}]); every task %d m / %d MiB. "+
		"Locality on: `--locality-weight=1` (the default); off: `--locality-weight=-1`; modes alternate run by run (on, off, off, on, ...), %d runs each. "+
		"Moved: the sum of the consume tasks' fetch_bytes (GetJob), over their input bytes (each one's dataset at its size on its holder, ListNodes after the run). Cross-checks: consume tasks on a node that holds their dataset (ListNodes), and those whose output says they found it there.\n\n",
		o.Agents, o.CPUMillis, o.MemoryMiB, extraArgsText(o.ExtraArgs), o.Jobs, o.Scheduler, o.DatasetMiB, o.Readers, o.TaskCPUMillis, o.TaskMemoryMiB, o.Runs)
	b.WriteString("| locality | runs | moved MiB per run p50 / max | moved fraction per run p50 / max | pooled moved / input MiB | pooled fraction | on / off | consume tasks local: fetch_bytes 0 / on holder / said local | failed tasks | producer nodes per run p50 / min | wall ms p50 / max |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	var off float64
	for _, s := range sums {
		if s.Mode == LocalityOff {
			off = s.Fraction
		}
	}
	for _, s := range sums {
		n := strconv.Itoa(s.N)
		if s.Errors > 0 {
			n += fmt.Sprintf(" (+%d unfinished)", s.Errors)
		}
		fmt.Fprintf(&b, "| %s | %s | %.1f / %.1f | %.3f / %.3f | %.1f / %.1f | %.3f | %.2f | %d / %d / %d of %d | %d | %.0f / %.0f | %s / %s |\n",
			s.Mode, n, s.MovedMiB.P50, s.MovedMiB.Max, s.Fractions.P50, s.Fractions.Max,
			float64(s.FetchBytes)/(1<<20), float64(s.InputBytes)/(1<<20), s.Fraction, ratio(s.Fraction, off),
			s.LocalFetch, s.LocalHolder, s.SaidLocal, s.Tasks, s.Failed, s.ProducerNodes.P50, s.ProducerNodes.Min, thousands(s.Wall.P50), thousands(s.Wall.Max))
	}
	fmt.Fprintf(&b, "\n(per run: locality.csv; per consume task: locality-tasks.csv; plot: locality.png. A placement blind to data puts a consume task on its dataset's node about 1 in %d times when the producers are spread.)\n\n", o.Agents)
	return b.String()
}

// RunLocality runs o.Runs runs per mode (localityOrder), writes
// locality.csv, locality-tasks.csv and locality.png to out, and returns the
// summary section. A run that fails is recorded (its error in the CSV) and
// the next one runs; the error returned names the failures.
func RunLocality(ctx context.Context, cfg Config, o LocalityOptions, out string) (string, error) {
	if ok, err := hasRegionFlag(cfg.Binary, "locality-weight"); err != nil {
		return "", err
	} else if !ok {
		return "", fmt.Errorf("locality: %s has no `region --locality-weight`", cfg.Binary)
	}
	var runs []LocalityRun
	var failures []string
	perMode := map[string]int{}
	for seq, mode := range localityOrder(o.Runs) {
		if ctx.Err() != nil {
			break
		}
		perMode[mode]++
		r, err := Locality(ctx, cfg, o, mode, perMode[mode], seq+1)
		if err != nil {
			r.Err = err.Error()
			failures = append(failures, fmt.Sprintf("%s run %d: %v", mode, r.Run, err))
			cfg.logf("locality %s run %d: %v", mode, r.Run, err)
		} else {
			cfg.logf("locality %s run %d: moved %d of %d bytes (%.3f); consume tasks local %d (fetch) / %d (holder) / %d (said) of %d; failed %d; producers on %v; wall %.0f ms",
				mode, r.Run, r.FetchBytes, r.InputBytes, r.Fraction(), r.LocalFetch, r.LocalHolder, r.SaidLocal, r.Stage2, r.Failed, r.Producers, r.WallMs)
		}
		runs = append(runs, r)
	}
	h, rows := LocalityRows(runs)
	if err := WriteCSV(filepath.Join(out, "locality.csv"), h, rows); err != nil {
		return "", err
	}
	h, rows = LocalityTaskRows(runs)
	if err := WriteCSV(filepath.Join(out, "locality-tasks.csv"), h, rows); err != nil {
		return "", err
	}
	var series []plotSeries
	for _, mode := range []string{LocalityOn, LocalityOff} {
		series = append(series, plotSeries{Name: "locality " + mode,
			XY: pointsOf(runs, func(r LocalityRun) int { return r.Seq }, func(r LocalityRun) float64 { return float64(r.FetchBytes) / (1 << 20) },
				func(r LocalityRun) bool { return r.Err == "" && r.Mode == mode })})
	}
	total := float64(o.Jobs) * float64(o.Readers) * float64(o.DatasetMiB)
	if err := savePlot(filepath.Join(out, "locality.png"), "stage-2 input MiB fetched (not on the task's node), locality on vs off",
		"run (order)", "MiB", series, []refLine{{Name: "all stage-2 input", Y: total}}); err != nil {
		return "", err
	}
	md := LocalityMarkdown(o, SummarizeLocality(runs))
	if len(failures) > 0 {
		return md, fmt.Errorf("locality: %s", strings.Join(failures, "; "))
	}
	return md, ctx.Err()
}
