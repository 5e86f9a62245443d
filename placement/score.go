package placement

import "math"

// Scores are the second stage: the K8s scheduling framework's Score plugins,
// Nomad's RankIterators. A scorer rates one feasible node for one task given
// the GPUs the task would get there, and declares how its raw value is
// normalised across the candidates before the weighted sum (K8s
// NormalizeScore; Nomad's ScoreNormalizationIterator averages scores that
// are already in [-1, 1]).
type scorer interface {
	score(c *taskCtx, st *state, i int, v *view, gpus []int) float64
	// norm says how raw scores are normalised.
	norm() normKind
}

type normKind uint8

const (
	// normFixed: the raw score is already in [-1, 1] and is used as is.
	normFixed normKind = iota
	// normMinMax: raw scores are scaled over the candidates to [0, 1]
	// (all equal: 1), so a scorer with a natural unit (GPU milli of
	// fragmentation) can be weighed against the others.
	normMinMax
)

// fitScorer is the resource-fit score (Nomad ScoreFitBinPack/ScoreFitSpread,
// K8s NodeResourcesFit MostAllocated/LeastAllocated). Over the dimensions the
// node has (cpu, memory, and GPUs when it has any), with f_d the free fraction
// of dimension d after the placement:
//
//	binpack = 1 - mean_d (10^f_d - 1) / 9   (Nomad's 20 - Σ10^f, scaled; 1 = full)
//	spread  = mean_d f_d                      (K8s LeastAllocated)
type fitScorer struct{ spread bool }

func (s fitScorer) norm() normKind { return normFixed }

func (s fitScorer) score(c *taskCtx, st *state, i int, v *view, _ []int) float64 {
	n := st.slot(i)
	var sum float64
	dims := 0
	add := func(free, cap float64) {
		if cap <= 0 {
			return
		}
		f := free / cap
		if f < 0 {
			f = 0
		}
		if s.spread {
			sum += f
		} else {
			sum += (pow10Frac(f) - 1) / 9
		}
		dims++
	}
	add(float64(v.cpuFree-c.req.CPUMillis), float64(n.cpuCap))
	add(float64(v.memFree-c.req.MemoryMiB), float64(n.memCap))
	if g := len(v.gpuFree); g > 0 {
		add(float64(sumFree(v.gpuFree)-c.req.GPUs*1000-c.req.GPUMilli), float64(g*1000))
	}
	if dims == 0 {
		return 0
	}
	if s.spread {
		return sum / float64(dims)
	}
	return 1 - sum/float64(dims)
}

// pow10Steps is the resolution of pow10Frac's table.
const pow10Steps = 4096

// pow10Table[k] = 10^(k/pow10Steps), k = 0..pow10Steps (+1 guard entry).
var pow10Table = func() []float64 {
	t := make([]float64, pow10Steps+2)
	for k := range t {
		t[k] = math.Pow(10, float64(k)/pow10Steps)
	}
	return t
}()

// pow10Frac is 10^f for a free fraction f, linearly interpolated in a table
// (relative error under 1e-7, exact at multiples of 1/4096; math.Exp costs
// about a fifth of a bin-pack scan). f is clamped to [0, 1].
func pow10Frac(f float64) float64 {
	if f <= 0 {
		return 1
	}
	if f >= 1 {
		return 10
	}
	x := f * pow10Steps
	k := int(x)
	return pow10Table[k] + (pow10Table[k+1]-pow10Table[k])*(x-float64(k))
}

// affinityScorer is Nomad's node affinity: Σ weights of the matching
// affinities / Σ |weights|, in [-1, 1] (negative weights are anti-affinity).
type affinityScorer struct{}

func (affinityScorer) norm() normKind { return normFixed }

func (affinityScorer) score(c *taskCtx, st *state, i int, _ *view, _ []int) float64 {
	var got, tot float64
	for k := range c.aff {
		a := &c.aff[k]
		w := float64(a.weight)
		tot += math.Abs(w)
		if a.memo.match(&a.m, st, i) {
			got += w
		}
	}
	if tot == 0 {
		return 0
	}
	return got / tot
}

// localityScorer prefers nodes holding the most input bytes: bytes of the
// task's datasets present on the node / total input bytes, in [0, 1].
type localityScorer struct{}

func (localityScorer) norm() normKind { return normFixed }

func (localityScorer) score(c *taskCtx, st *state, i int, _ *view, _ []int) float64 {
	if c.inputBytes <= 0 {
		return 0
	}
	held := st.nodes[i].Datasets
	var b int64
	for _, d := range c.t.Datasets {
		if h, ok := held[d.Name]; ok {
			b += min(h, d.SizeBytes)
		}
	}
	return float64(b) / float64(c.inputBytes)
}

// failureScorer penalises nodes where this task failed before (Nomad's
// NodeReschedulingPenaltyIterator): -(1 - 2^-k) after k failures there.
type failureScorer struct{}

func (failureScorer) norm() normKind { return normFixed }

func (failureScorer) score(c *taskCtx, st *state, i int, _ *view, _ []int) float64 {
	k := c.t.FailedOn[st.nodes[i].ID]
	if k <= 0 {
		return 0
	}
	return -(1 - math.Pow(2, -float64(k)))
}

// spreadScorer is Nomad's spread block: for each Spread of the task, a boost
// in [-1, 1] toward the value of the label that is furthest below its share,
// weighted by Spread.Weight (default 50). With Targets (value -> percent,
// unlisted values share the remaining percent as Nomad's "*"), the boost is
// (desired - used) / desired with desired = percent × (group size + 1); for
// an even spread it is (max - used) / max over the label's values in the
// snapshot. A node without the label gets -1.
type spreadScorer struct{}

func (spreadScorer) norm() normKind { return normFixed }

func (spreadScorer) score(c *taskCtx, st *state, i int, _ *view, _ []int) float64 {
	var got, tot float64
	for k := range c.t.Spreads {
		sp := &c.t.Spreads[k]
		w := float64(sp.Weight)
		if w <= 0 {
			w = 50
		}
		tot += w
		got += w * c.spreadMemo(k, st, i)
	}
	if tot == 0 {
		return 0
	}
	return got / tot
}

// spreadMemo is spreadBoost of the task's k-th Spread on node i, computed
// once per value of the label per task: the boost depends only on the
// node's value and on the group's counts, which change only between tasks.
func (c *taskCtx) spreadMemo(k int, st *state, i int) float64 {
	sp := &c.t.Spreads[k]
	if c.spread == nil {
		c.spread = make([]spreadCache, len(c.t.Spreads))
	}
	sc := &c.spread[k]
	if sc.lc == nil {
		sc.lc = st.codes(sp.Label)
		sc.mx = -1
		if len(sc.lc.values) <= codeMemoMaxValues {
			sc.boost = make([]float64, len(sc.lc.values))
			sc.known = make([]bool, len(sc.lc.values))
		}
	}
	code := sc.lc.of[i]
	if code < 0 {
		return -1 // no label
	}
	if sc.boost == nil {
		return spreadBoost(c, st, i, sp, &sc.mx)
	}
	if !sc.known[code] {
		sc.boost[code] = spreadBoost(c, st, i, sp, &sc.mx)
		sc.known[code] = true
	}
	return sc.boost[code]
}

type spreadCache struct {
	lc    *labelCodes
	boost []float64
	known []bool
	mx    int // the group's largest count over the label's values; -1 unknown
}

// spreadBoost is the boost of node i for sp; *mx caches the even spread's
// largest count across calls for one task (-1: not yet computed).
func spreadBoost(c *taskCtx, st *state, i int, sp *Spread, mx *int) float64 {
	val, ok := st.nodes[i].Labels[sp.Label]
	if !ok {
		return -1
	}
	counts := st.groups.valueCounts(c.group, sp.Label)
	if len(sp.Targets) > 0 {
		total := 0
		for _, n := range counts {
			total += n
		}
		pct, listed := sp.Targets[val]
		used := counts[val]
		if !listed {
			rest := 100
			for _, p := range sp.Targets {
				rest -= p
			}
			pct = max(rest, 0)
			used = 0
			for v, n := range counts {
				if _, l := sp.Targets[v]; !l {
					used += n
				}
			}
		}
		if pct <= 0 {
			return -1
		}
		desired := float64(pct) / 100 * float64(total+1)
		b := (desired - float64(used)) / desired
		return math.Max(-1, math.Min(1, b))
	}
	if *mx < 0 {
		*mx = 0
		for _, v := range st.labelValues(sp.Label) {
			if n := counts[v]; n > *mx {
				*mx = n
			}
		}
	}
	if *mx == 0 {
		return 0
	}
	return float64(*mx-counts[val]) / float64(*mx)
}
