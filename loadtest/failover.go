package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/regional/store"
)

// Failover of accepted jobs under kill-region (Options.FailoverAfter > 0):
// jobs carry failover: {after} (every fifth one failover: off, the
// baseline of the submission latency), half prefer the victim lt-a and half
// lt-b, so load runs on both; the victim stays down longer than after, so
// its in-flight failover jobs move to a standby; after its return the
// verifier checks the move's promises (FailoverSummary).

// noFailoverEvery: job i has failover: off when i % noFailoverEvery ==
// noFailoverEvery-1.
const noFailoverEvery = 5

func (o *Options) failoverDefaults() error {
	if o.FailoverAfter == 0 && !o.KillAgents {
		return nil
	}
	if o.Scenario != KillRegion {
		return fmt.Errorf("failover-after, kill-agents: only with scenario %s", KillRegion)
	}
	if o.FailoverAfter == 0 {
		return fmt.Errorf("kill-agents: needs failover-after (the variant kills the agents of the region whose jobs fail over)")
	}
	if o.FailoverAfter < time.Second || o.FailoverAfter > 10*time.Minute {
		return fmt.Errorf("failover-after: must be between 1s and 10m, got %s", o.FailoverAfter)
	}
	if o.Pause == 0 {
		o.Pause = o.FailoverAfter + 8*time.Second
	}
	if o.Pause <= o.FailoverAfter+2*time.Second {
		return fmt.Errorf("pause: the region must stay down longer than failover-after + 2s (%s), got %s", o.FailoverAfter+2*time.Second, o.Pause)
	}
	// 15 s after each return: the region settles, and the submit latency
	// away from faults (the standby write's cost) has a quiet window.
	if o.TrialEvery < o.Pause+15*time.Second {
		o.TrialEvery = o.Pause + 15*time.Second
	}
	if o.NodeLeaseTTL == 0 {
		// Three regions' processes and their tasks share the host's cores:
		// a 1 s lease lapses under that load and the KilledWorker rule
		// then fails tasks that only moved.
		o.NodeLeaseTTL = 3 * time.Second
	}
	if o.TaskSleep == 0 {
		o.TaskSleep = 6 * time.Second
	}
	if o.TasksPerJob == 0 {
		o.TasksPerJob = 4
	}
	o.DrainTimeout = max(o.DrainTimeout, 2*time.Minute)
	return nil
}

// failoverSpec shapes job i of a failover run (see above).
func (o *Options) failoverSpec(i int, s *apiaryv1.JobSpec) {
	if i%2 == 1 {
		s.Region = &apiaryv1.RegionSpec{Prefer: []string{"lt-b"}}
	}
	if i%noFailoverEvery == noFailoverEvery-1 {
		s.Failover = &apiaryv1.Failover{Disabled: true}
		return
	}
	s.Failover = &apiaryv1.Failover{AfterMs: o.FailoverAfter.Milliseconds()}
}

// FailoverSummary is what a failover run measured and checked.
type FailoverSummary struct {
	AfterMs int64 `json:"after_ms"`
	// Moved counts the jobs that failed over; MovedTasks their tasks.
	Moved      int `json:"moved_jobs"`
	MovedTasks int `json:"moved_tasks"`
	// ActivationAfterMs: per moved job, its activation in the standby
	// minus (the kill + after). FirstDispatchAfterMs: per trial, the first
	// attempt of a moved task started in a standby minus (the kill +
	// after), the figure.
	ActivationAfterMs    Quantiles `json:"activation_after_ms"`
	FirstDispatchAfterMs Quantiles `json:"first_dispatch_after_ms"`
	// ProgressLagMs: from a task's completion in its home region to its
	// completion record's arrival in a standby's etcd (a watch there).
	ProgressLagMs Quantiles `json:"progress_lag_ms"`
	// ReexecutedTasks: tasks of moved jobs that started in both the home
	// and the standby; ReexecutionsPerMove = ReexecutedTasks / Moved.
	ReexecutedTasks     int     `json:"reexecuted_tasks"`
	ReexecutionsPerMove float64 `json:"reexecutions_per_move"`
	// NotRerun: tasks of moved jobs whose replicated completion the standby
	// kept; UnreplicatedCompletions: tasks the home completed before it
	// died whose completion had not reached the standby (run again there).
	NotRerun                int `json:"not_rerun"`
	UnreplicatedCompletions int `json:"unreplicated_completions"`
	// Submit latency of jobs with failover (standby written before the
	// acknowledgement) and without, same run, away from the faults.
	SubmitWithStandbyMs    Quantiles `json:"submit_with_standby_ms"`
	SubmitWithoutStandbyMs Quantiles `json:"submit_without_standby_ms"`
	// Violations: an execution after a move whose token is not above every
	// home token of its task; a moved job's home completion after the move
	// (not the one the standby kept); a job that moved but is not complete.
	TokenViolations  []string      `json:"token_violations"`
	HomeLateComplete []string      `json:"home_late_complete"`
	Jobs             []FailoverJob `json:"-"`
}

// FailoverJob is one job's path, for failover.csv and the timeline.
type FailoverJob struct {
	ID, Home, Active, State     string
	SubmitMs, MovedMs, FinishMs int64
}

// OK reports whether the failover checks passed.
func (f *FailoverSummary) OK() bool { return len(f.TokenViolations)+len(f.HomeLateComplete) == 0 }

// lagWatch records, from watches on the standbys' etcd, how long each
// completion took to arrive there.
type lagWatch struct {
	mu   sync.Mutex
	lags []float64
	clis []*clientv3.Client
}

func startLagWatch(ctx context.Context, regions []*devcluster.Region) (*lagWatch, error) {
	w := &lagWatch{}
	for _, r := range regions {
		cli, err := clientv3.New(clientv3.Config{Endpoints: r.EtcdEndpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			w.close()
			return nil, err
		}
		w.clis = append(w.clis, cli)
		wc := cli.Watch(ctx, store.PrefStandbyDone, clientv3.WithPrefix())
		go func() {
			for wr := range wc {
				now := time.Now().UnixMilli()
				for _, ev := range wr.Events {
					var d store.TaskDoneRecord
					// The first delivery only: a home that restarts sends
					// its unfinished jobs' completions again.
					if ev.Type == clientv3.EventTypePut && ev.Kv.Version == 1 && json.Unmarshal(ev.Kv.Value, &d) == nil && d.DoneMs > 0 {
						w.mu.Lock()
						w.lags = append(w.lags, float64(now-d.DoneMs))
						w.mu.Unlock()
					}
				}
			}
		}()
	}
	return w, nil
}

func (w *lagWatch) close() {
	for _, c := range w.clis {
		c.Close()
	}
}

// measureFailover checks and measures the moves of a failover run. jobs
// are read through the router (which follows a moved job to its active
// region); the home region's own view of each moved job is read directly.
func measureFailover(ctx context.Context, res *Result, o Options, fed *devcluster.Cluster, jobs map[string]*apiaryv1.Job, ledger []Effect, lw *lagWatch) error {
	victim := fed.Regions[0]
	cc, err := cliconn.Dial(victim.Addr())
	if err != nil {
		return err
	}
	defer cc.Close()
	home := apiaryv1.NewJobServiceClient(cc)
	fs := &FailoverSummary{AfterMs: o.FailoverAfter.Milliseconds()}
	res.Failover = fs
	effects := map[string][]Effect{}
	for _, e := range ledger {
		k := fmt.Sprintf("%s/%d", e.JobID, e.Task)
		effects[k] = append(effects[k], e)
	}
	var activation []float64
	firstByTrial := map[int]float64{}
	ids := make([]string, 0, len(jobs))
	for id := range jobs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		j := jobs[id]
		fo := j.GetFailover()
		fj := FailoverJob{ID: id, Home: fo.GetHomeRegion(), Active: j.GetRegion(), State: strings.TrimPrefix(j.GetState().String(), "JOB_STATE_"),
			SubmitMs: j.GetSubmitTimeMs(), MovedMs: fo.GetMovedTimeMs(), FinishMs: j.GetFinishTimeMs()}
		if fj.Home == "" {
			fj.Home = j.GetRegion()
		}
		fs.Jobs = append(fs.Jobs, fj)
		if fo.GetEpoch() == 0 {
			continue
		}
		fs.Moved++
		fs.MovedTasks += len(j.GetTasks())
		trial := trialOf(res.TrialDetails, fo.GetMovedTimeMs())
		if trial >= 0 {
			at := res.TrialDetails[trial].At.UnixMilli() + fs.AfterMs
			activation = append(activation, float64(fo.GetMovedTimeMs()-at))
			for _, t := range j.GetTasks() {
				for _, a := range t.GetAttempts() {
					if a.GetFencingToken() >= 1<<store.FailoverTokenShift && a.GetStartTimeMs() > 0 {
						d := float64(a.GetStartTimeMs() - at)
						if v, ok := firstByTrial[trial]; !ok || d < v {
							firstByTrial[trial] = d
						}
					}
				}
			}
		}
		// The home's view: MOVED, its late completions discarded.
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		hr, err := home.GetJob(cctx, &apiaryv1.GetJobRequest{JobId: id})
		cancel()
		type done struct{ token, endMs int64 }
		homeDone := map[int32]done{}
		if err == nil {
			for _, t := range hr.GetJob().GetTasks() {
				if t.GetState() != apiaryv1.TaskState_TASK_STATE_COMPLETE {
					continue
				}
				d := done{token: t.GetFencingToken()}
				for _, a := range t.GetAttempts() {
					if a.GetOutcome() == "complete" {
						d.endMs = a.GetEndTimeMs()
					}
				}
				homeDone[t.GetIndex()] = d
			}
		}
		for _, t := range j.GetTasks() {
			k := fmt.Sprintf("%s/%d", id, t.GetIndex())
			if d, ok := homeDone[t.GetIndex()]; ok && d.token != t.GetFencingToken() {
				// The home completed the task too. Before the move (its
				// completion had not reached the standby when the home
				// died): a re-execution the replication lag caused. After
				// it: a completion the home should have discarded.
				if d.endMs >= fo.GetMovedTimeMs() {
					fs.HomeLateComplete = append(fs.HomeLateComplete, k)
				} else {
					fs.UnreplicatedCompletions++
				}
			}
			if t.GetFencingToken() < 1<<store.FailoverTokenShift && t.GetState() == apiaryv1.TaskState_TASK_STATE_COMPLETE {
				fs.NotRerun++
			}
			var maxHome int64
			inHome, inStandby := false, false
			for _, e := range effects[k] {
				if e.Region == fj.Home {
					inHome = true
					maxHome = max(maxHome, e.FencingToken)
				}
			}
			for _, e := range effects[k] {
				if e.Region != fj.Home {
					inStandby = true
					if e.FencingToken <= maxHome {
						fs.TokenViolations = append(fs.TokenViolations, fmt.Sprintf("%s@%s token %d <= home %d", k, e.Region, e.FencingToken, maxHome))
					}
				}
			}
			if inHome && inStandby {
				fs.ReexecutedTasks++
			}
		}
	}
	if fs.Moved > 0 {
		fs.ReexecutionsPerMove = float64(fs.ReexecutedTasks) / float64(fs.Moved)
	}
	fs.ActivationAfterMs = quantiles(nonNegative(activation))
	var first []float64
	for _, v := range firstByTrial {
		first = append(first, v)
	}
	fs.FirstDispatchAfterMs = quantiles(nonNegative(first))
	res.ValidTrials = len(firstByTrial)
	if lw != nil {
		lw.mu.Lock()
		fs.ProgressLagMs = quantiles(nonNegative(lw.lags))
		lw.mu.Unlock()
	}
	// Submit latency away from the faults (a sample intended within a
	// kill and pause + 5 s after it is left out): the cost of the standby
	// write itself, not of an outage.
	var with, without []float64
	inFault := func(t time.Time) bool {
		for _, tr := range res.TrialDetails {
			if !tr.At.IsZero() && !t.Before(tr.At) && t.Before(tr.At.Add(o.Pause+5*time.Second)) {
				return true
			}
		}
		return false
	}
	for _, s := range res.Samples {
		if s.JobID == "" || inFault(s.Intended) {
			continue
		}
		if s.Seq%noFailoverEvery == noFailoverEvery-1 {
			without = append(without, s.LatencyMs())
		} else {
			with = append(with, s.LatencyMs())
		}
	}
	fs.SubmitWithStandbyMs, fs.SubmitWithoutStandbyMs = quantiles(with), quantiles(without)
	return nil
}

// nonNegative clamps values below 0 (an activation a few ms before the
// harness's own clock says after has passed) to 0 for the histogram, which
// records positive values.
func nonNegative(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = math.Max(x, 0)
	}
	return out
}

// trialOf is the trial whose fault came last at or before ms (-1: none).
func trialOf(trials []Trial, ms int64) int {
	best := -1
	for i, t := range trials {
		if !t.At.IsZero() && t.At.UnixMilli() <= ms {
			best = i
		}
	}
	return best
}

// plotTimeline draws the jobs active in each region over the run (a job
// is active in its home from submission to its move or end, then in the
// region it moved to), with the faults (dashed) and the moves (points).
func plotTimeline(path string, res *Result, start time.Time) error {
	fs := res.Failover
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s, failover after %d ms: jobs active per region", res.Scenario, fs.AfterMs)
	p.X.Label.Text = "s since the load started"
	p.Y.Label.Text = "jobs active"
	s0 := start.UnixMilli()
	regions := map[string]bool{}
	var endMs int64
	for _, j := range fs.Jobs {
		regions[j.Home], regions[j.Active] = true, true
		endMs = max(endMs, j.FinishMs, j.SubmitMs)
	}
	names := make([]string, 0, len(regions))
	for r := range regions {
		names = append(names, r)
	}
	sort.Strings(names)
	top := 1.0
	for ri, r := range names {
		var pts plotter.XYs
		for t := s0; t <= endMs; t += 250 {
			n := 0
			for _, j := range fs.Jobs {
				fin := j.FinishMs
				if fin == 0 {
					fin = endMs
				}
				switch {
				case j.MovedMs > 0 && j.Home == r && t >= j.SubmitMs && t < j.MovedMs:
					n++
				case j.MovedMs > 0 && j.Active == r && t >= j.MovedMs && t < fin:
					n++
				case j.MovedMs == 0 && j.Active == r && t >= j.SubmitMs && t < fin:
					n++
				}
			}
			top = math.Max(top, float64(n))
			pts = append(pts, plotter.XY{X: float64(t-s0) / 1000, Y: float64(n)})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(ri)
		p.Add(l)
		p.Legend.Add(r, l)
	}
	var moves plotter.XYs
	for _, j := range fs.Jobs {
		if j.MovedMs > 0 {
			moves = append(moves, plotter.XY{X: float64(j.MovedMs-s0) / 1000, Y: 0})
		}
	}
	if len(moves) > 0 {
		sc, err := plotter.NewScatter(moves)
		if err != nil {
			return err
		}
		p.Add(sc)
		p.Legend.Add("job moved", sc)
	}
	for _, t := range res.TrialDetails {
		x := float64(t.At.UnixMilli()-s0) / 1000
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: top}})
		if err != nil {
			return err
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
	}
	return p.Save(10*vg.Inch, 4*vg.Inch, path)
}

// FailoverLines is the text summary of a failover run.
func FailoverLines(fs *FailoverSummary) []string {
	return []string{
		fmt.Sprintf("failover after %d ms: %d job(s) moved (%d tasks); %d task(s) not rerun (completion replicated), %d re-executed by the move (%.2f per move), of which %d had completed at home before it died (completion not yet replicated)",
			fs.AfterMs, fs.Moved, fs.MovedTasks, fs.NotRerun, fs.ReexecutedTasks, fs.ReexecutionsPerMove, fs.UnreplicatedCompletions),
		"first dispatch of a moved task minus after (per trial), ms: " + q(fs.FirstDispatchAfterMs),
		"activation minus after (per job), ms: " + q(fs.ActivationAfterMs),
		"progress replication lag, ms: " + q(fs.ProgressLagMs),
		"submit latency with standby write (away from the faults), ms: " + q(fs.SubmitWithStandbyMs),
		"submit latency without (failover: off; same), ms: " + q(fs.SubmitWithoutStandbyMs),
		fmt.Sprintf("token violations %v, home completions after the move %v", fs.TokenViolations, fs.HomeLateComplete),
	}
}
