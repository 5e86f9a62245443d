package bench

// Sharded ownership seen from outside (docs/architecture.md, "Components",
// "Takeover on suspicion"): which coordinator owns which of the region's S
// shards, read from the owner keys /apiary/shards/<s>/owner, whether the
// region has settled on the rendezvous assignment (shards.Desired over the
// scheduling members), and the shards make-bench-shards runs: Failover
// (failover.go) and DrainOwners (drain.go), written out by RunShards.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"apiary.dev/apiary/shards"
)

// prefMembers holds one key per live coordinator (regional/keys.go).
const prefMembers = "/apiary/members/"

// ownerLayout is the region's owner keys for count shards.
func ownerLayout(count int) shards.Layout {
	return shards.Layout{Prefix: shards.DefaultPrefix, Count: count}
}

// taskShard returns the shard of a task key /apiary/tasks/<s>/<job>/<index>;
// ok is false for any other key.
func taskShard(key string) (s int, ok bool) {
	rest, ok := strings.CutPrefix(key, prefTasks)
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, "/")
	if !ok || num == "" {
		return 0, false
	}
	s, err := strconv.Atoi(num)
	if err != nil || s < 0 {
		return 0, false
	}
	return s, true
}

// memberRecord is the part of a coordinator's member record
// (/apiary/members/<id>) the harness reads: api_only is set by a
// coordinator that owns no shards (`apiary region --schedule=false`).
type memberRecord struct {
	APIOnly bool `json:"api_only"`
}

// schedulingMembers reads the live coordinators and returns, sorted, those
// that take shards (sched) and all of them (all).
func schedulingMembers(ctx context.Context, cli *clientv3.Client) (sched, all []string, err error) {
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Get(gctx, prefMembers, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, err
	}
	for _, kv := range resp.Kvs {
		id := strings.TrimPrefix(string(kv.Key), prefMembers)
		all = append(all, id)
		var rec memberRecord
		if json.Unmarshal(kv.Value, &rec) == nil && rec.APIOnly {
			continue
		}
		sched = append(sched, id)
	}
	slices.Sort(sched)
	slices.Sort(all)
	return sched, all, nil
}

// misplaced returns, in order, the shards whose owner is not the one desired
// (desired[s], as shards.Desired returns): unowned, or owned by another.
func misplaced(desired []string, owners map[int]shards.Ownership) []int {
	var out []int
	for s, want := range desired {
		if o, ok := owners[s]; !ok || o.Member != want {
			out = append(out, s)
		}
	}
	return out
}

// settledView is a region whose every shard is owned by its rendezvous
// owner: the scheduling members, the owners snapshot, and each member's
// shards.
type settledView struct {
	Members   []string
	Owners    shards.Snapshot
	PerMember map[string][]int
}

// waitSettled polls (every 20 ms, for at most limit) until the region's
// scheduling members number want (0: any) and every one of its count shards
// is owned by shards.Desired of them.
func waitSettled(ctx context.Context, cli *clientv3.Client, count, want int, limit time.Duration) (settledView, error) {
	var v settledView
	layout := ownerLayout(count)
	err := waitFor(ctx, limit, fmt.Sprintf("every shard owned by its rendezvous owner (%d scheduling members)", want), func() (bool, error) {
		sched, all, err := schedulingMembers(ctx, cli)
		if err != nil {
			return false, err
		}
		if len(sched) == 0 || (want > 0 && len(sched) != want) {
			return false, fmt.Errorf("scheduling members %v of live %v", sched, all)
		}
		snap, err := shards.ReadOwners(ctx, cli, layout)
		if err != nil {
			return false, err
		}
		desired := shards.Desired(sched, count)
		if bad := misplaced(desired, snap.Owners); len(bad) > 0 {
			return false, fmt.Errorf("%d of %d shards not on their rendezvous owner (first: %d)", len(bad), count, bad[0])
		}
		v = settledView{Members: sched, Owners: snap, PerMember: map[string][]int{}}
		for s, m := range desired {
			v.PerMember[m] = append(v.PerMember[m], s)
		}
		return true, nil
	})
	return v, err
}

// maxGap is the longest interval between consecutive instants of ts
// (unordered, any unit) inside [from, to], the window's ends counting as
// instants: a window with no instant has a gap of to - from.
func maxGap(ts []float64, from, to float64) float64 {
	in := slices.DeleteFunc(slices.Clone(ts), func(t float64) bool { return t < from || t > to })
	slices.Sort(in)
	prev, gap := from, 0.0
	for _, t := range in {
		gap = max(gap, t-prev)
		prev = t
	}
	return max(gap, to-prev)
}

// weightedPercentile is the nearest-rank p-th percentile (0 < p <= 100) of
// xs when xs[i] counts w[i] times: the smallest x whose cumulative weight
// reaches p% of the total (0 for no samples or no weight).
func weightedPercentile(xs, w []float64, p float64) float64 {
	idx := make([]int, len(xs))
	var total float64
	for i := range idx {
		idx[i] = i
		total += w[i]
	}
	if total <= 0 {
		return 0
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(xs[a], xs[b]) })
	var acc float64
	for _, i := range idx {
		acc += w[i]
		if acc >= p/100*total*(1-1e-12) {
			return xs[i]
		}
	}
	return xs[idx[len(idx)-1]]
}

// countIn counts the instants of ts inside [from, to].
func countIn(ts []float64, from, to float64) int {
	n := 0
	for _, t := range ts {
		if t >= from && t <= to {
			n++
		}
	}
	return n
}

// metricsUp checks that a /metrics address answers 200 (metricSum reads 0
// from an address that does not, which would pass for a zero counter).
func metricsUp(addr string) error {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return fmt.Errorf("metrics %s: %w", addr, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("metrics %s: %s", addr, resp.Status)
	}
	return nil
}

// hasRegionFlag reports whether `bin region --help` lists --name.
func hasRegionFlag(bin, name string) (bool, error) {
	out, err := exec.Command(bin, "region", "--help").CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("%s region --help: %w", bin, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		for _, w := range f {
			if w == "--"+name {
				return true, nil
			}
		}
	}
	return false, nil
}

// ShardsOptions is `make bench-shards`: the failover and the drain with 1
// against 3 shard owners, in one run.
type ShardsOptions struct {
	Failover FailoverOptions
	Drain    DrainOptions
	// DrainTrials per owner count (3 and 1), alternating.
	DrainTrials int
}

// DefaultShards is the configuration of `make bench-shards`.
var DefaultShards = ShardsOptions{Failover: DefaultFailover, Drain: DefaultDrain, DrainTrials: 3}

// RunShards runs the failover trials, then the drain trials (3 owners
// against 1, alternating, when the binary has `region --schedule`; 3 owners
// only otherwise), writes failover.csv, drain-owners.csv and a PNG per
// measure to out, and returns the summary's markdown. A failed part is
// logged, its error returned after the other part ran.
func RunShards(ctx context.Context, cfg Config, o ShardsOptions, out string) (string, error) {
	var md strings.Builder
	var firstErr error
	note := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	trials, err := Failover(ctx, cfg, o.Failover)
	if err != nil {
		cfg.logf("shards failover: %v", err)
		note(fmt.Errorf("failover: %w", err))
	}
	fmd, err := WriteFailover(out, o.Failover, trials)
	note(err)
	md.WriteString(fmd)
	if ctx.Err() != nil {
		return md.String(), ctx.Err()
	}
	schedFlag, err := hasRegionFlag(cfg.Binary, "schedule")
	if err != nil {
		return md.String(), err
	}
	runs, err := DrainOwners(ctx, cfg, o.Drain, o.DrainTrials, schedFlag)
	if err != nil {
		cfg.logf("shards drain: %v", err)
		note(fmt.Errorf("drain: %w", err))
	}
	dmd, err := WriteDrainOwners(out, o.Drain, runs, schedFlag)
	note(err)
	md.WriteString(dmd)
	return md.String(), firstErr
}

// plotSeries is one set of points of a plot (x: trial number).
type plotSeries struct {
	Name string
	XY   plotter.XYs
}

// refLine is a horizontal reference line (a target, a floor).
type refLine struct {
	Name string
	Y    float64
}

var plotColors = []color.RGBA{{B: 200, A: 255}, {R: 220, G: 100, A: 255}, {G: 150, A: 255}, {R: 140, B: 140, A: 255}}

// savePlot draws each series as points and each reference line dashed, and
// writes the PNG to path.
func savePlot(path, title, xLabel, yLabel string, series []plotSeries, lines []refLine) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Y.Min = 0
	xMax, yMax := 1.0, 1.0
	for _, s := range series {
		for _, pt := range s.XY {
			xMax, yMax = max(xMax, pt.X), max(yMax, pt.Y)
		}
	}
	for _, l := range lines {
		yMax = max(yMax, l.Y)
	}
	// Headroom above the data for the legend (top left).
	p.Y.Max = yMax * (1.25 + 0.07*float64(len(series)+len(lines)))
	p.X.Min, p.X.Max = 0.5, xMax+0.5
	for i, s := range series {
		if len(s.XY) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(s.XY)
		if err != nil {
			return err
		}
		sc.GlyphStyle.Radius = vg.Points(3)
		sc.GlyphStyle.Color = plotColors[i%len(plotColors)]
		sc.GlyphStyle.Shape = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.TriangleGlyph{}, draw.SquareGlyph{}, draw.CrossGlyph{}}[i%4]
		p.Add(sc)
		p.Legend.Add(s.Name, sc)
	}
	for i, l := range lines {
		ln, err := plotter.NewLine(plotter.XYs{{X: p.X.Min, Y: l.Y}, {X: p.X.Max, Y: l.Y}})
		if err != nil {
			return err
		}
		ln.Color = []color.RGBA{{R: 200, A: 255}, {R: 120, G: 120, B: 120, A: 255}, {G: 120, B: 200, A: 255}, {R: 200, G: 150, A: 255}}[i%4]
		ln.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(ln)
		p.Legend.Add(l.Name, ln)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

// pointsOf returns (trial, f(t)) for every t with keep(t).
func pointsOf[T any](ts []T, trial func(T) int, f func(T) float64, keep func(T) bool) plotter.XYs {
	var xy plotter.XYs
	for _, t := range ts {
		if keep == nil || keep(t) {
			xy = append(xy, plotter.XY{X: float64(trial(t)), Y: f(t)})
		}
	}
	return xy
}

// dist formats a distribution for the summary: n, p50 / p95 / max.
func dist(xs []float64) string {
	if len(xs) == 0 {
		return "n=0"
	}
	s := Summarize(xs)
	return fmt.Sprintf("n=%d: %s / %s / %s", s.N, thousands(s.P50), thousands(s.P95), thousands(s.Max))
}

// thousands formats ms rounded, with a comma every three digits.
func thousands(x float64) string {
	s := strconv.FormatInt(int64(math.Round(x)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}
