package loadtest

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// WriteResults writes a run's raw rows (samples.csv, trials.csv), the JSON
// result, a README (command, configuration, host, caveats) and a PNG of
// submit latency over time with each fault marked, into dir.
func WriteResults(dir string, res *Result, command string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	start := time.Time{}
	if len(res.Samples) > 0 {
		start = res.Samples[0].Intended
	}
	if err := writeCSV(filepath.Join(dir, "samples.csv"), []string{"seq", "intended_ms", "latency_ms", "lag_ms", "job_id", "error"}, func(w func([]string)) {
		for _, s := range res.Samples {
			w([]string{strconv.Itoa(s.Seq), ms(s.Intended.Sub(start)), fmt.Sprintf("%.3f", s.LatencyMs()), fmt.Sprintf("%.3f", s.LagMs()), s.JobID, s.Err})
		}
	}); err != nil {
		return err
	}
	if err := writeCSV(filepath.Join(dir, "trials.csv"), []string{"trial", "fault", "target", "at_ms", "fault_to_dispatch_ms", "valid", "note"}, func(w func([]string)) {
		for _, t := range res.TrialDetails {
			w([]string{strconv.Itoa(t.N), t.Fault, t.Target, ms(t.At.Sub(start)), fmt.Sprintf("%.0f", t.FaultToDispatchMs), strconv.FormatBool(t.Valid), t.Note})
		}
	}); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "result.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := plotLatency(filepath.Join(dir, "submit-latency.png"), res, start); err != nil {
		return err
	}
	o := res.Config
	host, _ := os.Hostname()
	readme := fmt.Sprintf(`# loadtest %s

Command: %s

Configuration: scenario %s, %d trial(s) every %s, open-loop rate %.0f jobs/s for %s, %d task(s) per job
(each appends one ledger line, then sleeps %s), one region of %d coordinator(s) (embedded etcd, election
500 ms / heartbeat 50 ms) and %d agent(s) x %d slots, node lease %s, pause %s; all real processes on loopback.

Host: %s, %d CPUs (GOMAXPROCS %d), %s/%s. The load generator, coordinators, agents and tasks share the
same cores, so the figures are lower bounds on what separate machines would do.

| figure | value |
|---|---|
| submitted / accepted | %d / %d |
| completed / failed | %d / %d |
| lost / duplicates / sovereignty violations | %d / %d / %d |
| throughput | %.1f tasks/s |
| submit latency (from intended send time) | %s |
| schedule latency (submit to first task start) | %s |
| fault to dispatch (valid trials %d of %d) | %s |
| generator lag | %s |

Verdict: %s

Caveats: fault-to-dispatch uses agent process start times (dispatch plus process spawn); for scheduler
faults it is the first task started under the successor's epoch, for agent faults the time until every
task the node held had started again elsewhere. Files: samples.csv (one row per submission),
trials.csv, result.json, submit-latency.png.
`, o.Scenario, command, o.Scenario, o.Trials, o.TrialEvery, o.Rate, o.Duration, o.TasksPerJob, o.TaskSleep,
		o.Coordinators, o.Agents, o.Slots, o.NodeLeaseTTL, o.Pause, host, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH,
		res.Submitted, res.Accepted, res.Completed, res.Failed, res.Lost, res.Duplicates, res.SovereigntyViolations,
		res.ThroughputTasksPerS, q(res.SubmitLatencyMs), q(res.ScheduleLatencyMs), res.ValidTrials, res.Trials, q(res.FaultToDispatchMs), q(res.GeneratorLagMs),
		verdictLine(res.Verdict))
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte(readme), 0o644)
}

func verdictLine(v Verdict) string {
	if v.OK() {
		return "every accepted job finished; no duplicate, no stale effect with a newer token, no sovereignty violation"
	}
	return "VIOLATIONS: " + v.Error()
}

func q(x Quantiles) string {
	if x.N == 0 {
		return "n=0"
	}
	return fmt.Sprintf("n=%d p50 %.1f ms, p95 %.1f ms, p99 %.1f ms, max %.1f ms", x.N, x.P50, x.P95, x.P99, x.Max)
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

func writeCSV(path string, header []string, rows func(func([]string))) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(header)
	rows(func(r []string) { _ = w.Write(r) })
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// plotLatency draws submit latency against the intended send time, with a
// vertical line at each fault.
func plotLatency(path string, res *Result, start time.Time) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("apiary loadtest %s: submit latency (open loop, %.0f jobs/s)", res.Scenario, res.Config.Rate)
	p.X.Label.Text = "intended send time (s)"
	p.Y.Label.Text = "latency (ms)"
	pts := make(plotter.XYs, 0, len(res.Samples))
	var top float64
	for _, s := range res.Samples {
		x := s.Intended.Sub(start).Seconds()
		y := s.LatencyMs()
		pts = append(pts, plotter.XY{X: x, Y: y})
		top = max(top, y)
	}
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return err
	}
	sc.GlyphStyle.Radius = vg.Points(1.2)
	sc.GlyphStyle.Color = color.RGBA{B: 200, A: 255}
	p.Add(sc)
	for _, t := range res.TrialDetails {
		if t.At.IsZero() {
			continue
		}
		x := t.At.Sub(start).Seconds()
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: max(top, 1)}})
		if err != nil {
			return err
		}
		l.Color = color.RGBA{R: 220, A: 255}
		l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		p.Add(l)
	}
	p.Legend.Add("submission", sc)
	if len(res.TrialDetails) > 0 {
		p.Legend.Add(strings.ReplaceAll("fault ("+res.Scenario+")", "-", " "))
	}
	return p.Save(8*vg.Inch, 4*vg.Inch, path)
}
