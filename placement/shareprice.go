package placement

import (
	"cmp"
	"slices"
)

// This file prices GPU shares for the fragmentation policy: the packing
// charge of the hybrid measure.
//
// The GPU shares of a workload (tasks asking for part of one GPU) are a bin
// packing problem with bins of 1,000 milli. Its fractional relaxation, the
// Gilmore-Gomory LP (Gilmore and Gomory, "A Linear Programming Approach to
// the Cutting-Stock Problem", Operations Research 9(6), 1961), packs the
// workload's share mix d_s into the fewest GPUs using packing patterns (a
// multiset of share sizes that fits one GPU). Its dual gives every share
// size s a price y_s, in GPUs, such that no pattern is worth more than one
// GPU (Σ_s a_s y_s ≤ 1) and Σ_s d_s y_s equals the LP optimum: y_s is the
// part of a GPU a share of size s is worth in an optimal packing of the mix.
//
// A free gap of f milli on a GPU is then worth val(f), the most a set of
// shares fitting in f is priced at (an unbounded knapsack over the sizes).
// Putting a share of size s into a gap f (or an idle GPU, f = 1,000, worth
// one GPU) costs
//
//	loss(f, s) = val(f) - y_s - val(f-s)    (idle GPU: 1 - y_s - val(1000-s))
//
// in GPUs: ≥ 0 by construction (val(f) ≥ y_s + val(f-s)), and 0 exactly
// when the share is part of a most valuable fill of the gap. Best fit
// ignores which sizes a gap can still take; on the Alibaba trace it puts a
// 230-milli share into a 650's 350-milli gap,
// whose natural partner (a 320, priced 1/3) then opens a GPU of its own,
// instead of next to a 470 (530 left, worth two 230s). The charge prefers
// placements of zero loss. Using the duals of the mix's LP to steer an
// online packer follows the primal-dual approach to online stochastic bin
// packing (Gupta and Radovanović, "Interior-Point-Based Online Stochastic
// Bin Packing", Operations Research 68(5), 2020); the simple reduced-cost
// rule here is ours. Measured effect: BENCHMARKS.md.
//
// Sizes not in the workload are priced at val(s), the worth of the space
// they take. Shares with GPU-model constraints are priced with the rest
// (one LP over all models).

// sharePrices is the solved price table, indexed by milli.
type sharePrices struct {
	val   [1001]float64 // val[f]: worth of a gap of f milli, in GPUs
	price [1001]float64 // price[s]: y_s, or val[s] for a size not in the mix
}

// maxPricedSizes bounds the LP: only the most frequent share sizes get a
// dual price of their own; rarer ones are priced at val(s). Solving takes
// ~2 ms for DefaultWorkload's 13 sizes, 1-7 ms for the Alibaba trace's 20,
// 2-15 ms for 24 or 32 sizes drawn uniformly from 20-990 milli and
// 25-100 ms for 64 (n=3 each).
const maxPricedSizes = 32

// maxPricingRounds bounds the constraint generation. Each round adds the
// pattern the prices overvalue most.
const maxPricingRounds = 300

// maxPivots bounds the simplex pivots of one pricing, all rounds together.
const maxPivots = 20000

// maxPacking solves the packing LP max c·y subject to A y ≤ 1, y ≥ 0 (A's
// rows are patterns: nonnegative, and every column has a positive entry,
// so the LP is bounded) with the tableau simplex method, starting from the
// all-slack basis (y = 0 is feasible, so no phase 1). It pivots by Bland's
// rule (lowest-index entering column with positive reduced cost, ties in
// the ratio test to the lowest-index basic variable), which cannot cycle
// on these highly degenerate LPs: gonum's lp.Simplex, tried first, uses
// the steepest reduced cost with no iteration bound and did not return on
// some 24-size workloads. At most *budget pivots are made (it is
// decremented); done is false if the budget ran out first, y then being
// the current basic solution, which is still feasible.
func maxPacking(A [][]float64, c []float64, budget *int) (y []float64, done bool) {
	const eps = 1e-9
	m, n := len(A), len(c)
	w := n + m + 1 // structural, slack, right-hand side
	t := make([]float64, (m+1)*w)
	row := func(i int) []float64 { return t[i*w : (i+1)*w] }
	basis := make([]int, m)
	for i, a := range A {
		r := row(i)
		copy(r, a)
		r[n+i] = 1
		r[w-1] = 1
		basis[i] = n + i
	}
	obj := row(m) // reduced costs: c_j - c_B B^-1 a_j
	copy(obj, c)
	for {
		enter := -1
		for j := 0; j < n+m; j++ {
			if obj[j] > eps {
				enter = j
				break
			}
		}
		if enter < 0 {
			done = true
			break
		}
		if *budget <= 0 {
			break
		}
		*budget--
		leave := -1
		var best float64
		for i := 0; i < m; i++ {
			a := row(i)[enter]
			if a <= eps {
				continue
			}
			ratio := row(i)[w-1] / a
			if leave < 0 || ratio < best-eps || (ratio <= best+eps && basis[i] < basis[leave]) {
				leave, best = i, ratio
			}
		}
		if leave < 0 {
			break // unbounded: impossible for a packing LP; keep y
		}
		pr := row(leave)
		pv := pr[enter]
		for j := range pr {
			pr[j] /= pv
		}
		for i := 0; i <= m; i++ {
			if i == leave {
				continue
			}
			r := row(i)
			f := r[enter]
			if f == 0 {
				continue
			}
			for j := range r {
				r[j] -= f * pr[j]
			}
		}
		basis[leave] = enter
	}
	y = make([]float64, n)
	for i, b := range basis {
		if b < n {
			y[b] = max(0, row(i)[w-1])
		}
	}
	return y, done
}

// priceShares solves the dual of the fractional bin-packing LP for share
// sizes (milli, 1-999) with demands (relative counts > 0) by constraint
// generation: solve over the patterns found so far, find the pattern the
// prices overvalue most (a knapsack), add it, repeat until none is worth
// more than one GPU. It stops early after rounds rounds or maxPivots
// simplex pivots in all, with the last prices scaled down to be feasible
// (every pattern worth at most one GPU), if not optimal.
func priceShares(sizes []int, demand []float64, rounds int) *sharePrices {
	n := len(sizes)
	if n == 0 {
		return nil
	}
	var pats [][]float64
	for i, s := range sizes {
		p := make([]float64, n)
		p[i] = float64(1000 / s) // each size alone, as many as fit
		pats = append(pats, p)
	}
	budget := maxPivots
	var y []float64
	for round := 0; ; round++ {
		var done bool
		y, done = maxPacking(pats, demand, &budget)
		worth, pat := knapsack(sizes, y, 1000)
		if worth <= 1+1e-9 {
			break
		}
		if !done || round >= rounds {
			for i := range y {
				y[i] /= worth
			}
			break
		}
		row := make([]float64, n)
		for i, a := range pat {
			row[i] = float64(a)
		}
		pats = append(pats, row)
	}
	p := &sharePrices{}
	best, _ := knapsackTable(sizes, y, 1000)
	copy(p.val[:], best)
	for s := 1; s < 1000; s++ {
		p.price[s] = p.val[s]
	}
	for i, s := range sizes {
		p.price[s] = y[i]
	}
	return p
}

// knapsackTable returns best[f], the most Σ vals of a multiset of sizes
// fitting in f, for f = 0..c, and from[f], the last size index taken at f
// (-1: none, f-1 is as good).
func knapsackTable(sizes []int, vals []float64, c int) ([]float64, []int) {
	best := make([]float64, c+1)
	from := make([]int, c+1)
	from[0] = -1
	for f := 1; f <= c; f++ {
		best[f], from[f] = best[f-1], -1
		for i, s := range sizes {
			if s <= f && best[f-s]+vals[i] > best[f]+1e-12 {
				best[f], from[f] = best[f-s]+vals[i], i
			}
		}
	}
	return best, from
}

// knapsack returns the most Σ vals of a multiset of sizes fitting in c, and
// the multiset as counts per size.
func knapsack(sizes []int, vals []float64, c int) (float64, []int) {
	best, from := knapsackTable(sizes, vals, c)
	cnt := make([]int, len(sizes))
	for f := c; f > 0; {
		if from[f] < 0 {
			f--
			continue
		}
		cnt[from[f]]++
		f -= sizes[from[f]]
	}
	return best[c], cnt
}

// loss is the packing charge, in GPU milli, of putting a share of milli on
// a GPU with free milli (1000: an idle GPU); 0 for anything but a share
// that fits.
func (p *sharePrices) loss(free, milli int) float64 {
	if p == nil || milli <= 0 || milli >= 1000 || free < milli {
		return 0
	}
	var l float64
	if free >= 1000 {
		l = 1 - p.price[milli] - p.val[1000-milli]
	} else {
		l = p.val[free] - p.price[milli] - p.val[free-milli]
	}
	return 1000 * max(0, l)
}

// packingCharge is the weighted packing charge (GPU milli) of putting a
// share request on a GPU with free milli; 0 when the charge is off or req
// is not a share.
func (m *fragModel) packingCharge(free int, req Resources) float64 {
	if m.packWeight <= 0 || req.GPUMilli <= 0 || req.GPUs > 0 {
		return 0
	}
	m.pricesOnce.Do(m.buildPrices)
	return m.packWeight * m.prices.loss(free, req.GPUMilli)
}

// buildPrices prices the workload's share classes (by size, all models
// together): the maxPricedSizes most frequent sizes enter the LP. It runs
// on the first share a fragmentation-policy task places, once per engine.
func (m *fragModel) buildPrices() {
	dem := map[int]float64{}
	for _, k := range m.classes {
		if k.milli > 0 && k.milli < 1000 && k.gpus == 0 {
			dem[k.milli] += k.p
		}
	}
	sizes := make([]int, 0, len(dem))
	for s := range dem {
		sizes = append(sizes, s)
	}
	slices.SortFunc(sizes, func(a, b int) int {
		return cmp.Or(cmp.Compare(dem[b], dem[a]), cmp.Compare(a, b))
	})
	sizes = sizes[:min(len(sizes), maxPricedSizes)]
	slices.Sort(sizes)
	d := make([]float64, len(sizes))
	for i, s := range sizes {
		d[i] = dem[s]
	}
	m.prices = priceShares(sizes, d, maxPricingRounds)
}
