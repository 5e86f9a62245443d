package placement

import (
	"math"
	"slices"
	"testing"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
	"pgregory.net/rapid"
)

func TestSharePricesKnownMixes(t *testing.T) {
	// Halves pair perfectly: each is worth half a GPU.
	p := priceShares([]int{500}, []float64{1}, maxPricingRounds)
	if math.Abs(p.price[500]-0.5) > 1e-9 || math.Abs(p.val[1000]-1) > 1e-9 {
		t.Fatalf("500 alone: price %v, val(1000) %v; want 0.5 and 1", p.price[500], p.val[1000])
	}
	// Ten 810s for every 160: each 810 needs a GPU of its own and every 160
	// fits beside one, so a 160 is free and an 810 costs a whole GPU.
	p = priceShares([]int{160, 810}, []float64{1, 10}, maxPricingRounds)
	if math.Abs(p.price[810]-1) > 1e-9 || p.price[160] > 1e-9 {
		t.Fatalf("810 and 160: prices %v, %v; want 1 and 0", p.price[810], p.price[160])
	}
	// Every placement that can still end as 810+160 loses nothing: an 810
	// or a 160 on an idle GPU, a 160 in a 190-milli gap.
	for _, c := range [][2]int{{1000, 810}, {190, 160}, {1000, 160}} {
		if l := p.loss(c[0], c[1]); l != 0 {
			t.Errorf("%d in a %d gap: loss %v, want 0", c[1], c[0], l)
		}
	}
	// A size outside the mix is priced at what its space is worth. With only
	// 500s expected, a 300 in a 500 gap kills a 500's place (half a GPU);
	// in a 900 gap it costs nothing. Best fit would take the 500 gap.
	p = priceShares([]int{500}, []float64{1}, maxPricingRounds)
	if l := p.loss(500, 300); math.Abs(l-500) > 1e-6 {
		t.Errorf("300 in a 500 gap: loss %v, want 500", l)
	}
	if l := p.loss(900, 300); l != 0 {
		t.Errorf("300 in a 900 gap: loss %v, want 0", l)
	}
	// Bad sizes and shares that do not fit cost nothing (they are not
	// shares this charge prices).
	for _, c := range [][2]int{{100, 160}, {1000, 0}, {1000, 1000}, {500, -5}} {
		if l := p.loss(c[0], c[1]); l != 0 {
			t.Errorf("loss(%d, %d) = %v, want 0", c[0], c[1], l)
		}
	}
	var nilP *sharePrices
	if nilP.loss(1000, 500) != 0 {
		t.Error("nil table: loss not 0")
	}
}

// patterns lists every multiset of sizes (counts per size) that fits in
// 1000 milli and holds at least one share.
func patterns(sizes []int) [][]int {
	var out [][]int
	cnt := make([]int, len(sizes))
	var rec func(i, room int)
	rec = func(i, room int) {
		if i == len(sizes) {
			for _, c := range cnt {
				if c > 0 {
					out = append(out, append([]int(nil), cnt...))
					return
				}
			}
			return
		}
		for k := 0; k*sizes[i] <= room; k++ {
			cnt[i] = k
			rec(i+1, room-k*sizes[i])
		}
		cnt[i] = 0
	}
	rec(0, 1000)
	return out
}

// primalBins solves the primal LP over every pattern: min Σ x_p subject to
// Σ_p a_p x_p ≥ d, x ≥ 0 (as equalities with surplus variables).
func primalBins(sizes []int, d []float64) (float64, error) {
	pats := patterns(sizes)
	n, m := len(sizes), len(pats)
	A := mat.NewDense(n, m+n, nil)
	for j, p := range pats {
		for i, a := range p {
			A.Set(i, j, float64(a))
		}
	}
	for i := range n {
		A.Set(i, m+i, -1)
	}
	c := make([]float64, m+n)
	for j := range m {
		c[j] = 1
	}
	opt, _, err := lp.Simplex(c, A, d, 1e-10, nil)
	return opt, err
}

// The prices are an optimal dual solution: no GPU pattern is worth more
// than one GPU, none is negative, and the mix's worth Σ d_s y_s equals the
// fewest GPUs the fractional packing needs (strong duality, checked against
// the primal LP over every pattern). The loss of any placement is then ≥ 0.
func TestSharePricesAreOptimalDuals(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(1, 5).Draw(t, "sizes")
		set := map[int]bool{}
		var sizes []int
		for len(sizes) < k {
			s := rapid.IntRange(10, 99).Draw(t, "size") * 10
			if !set[s] {
				set[s] = true
				sizes = append(sizes, s)
			}
		}
		slices.Sort(sizes)
		d := make([]float64, k)
		for i := range d {
			d[i] = float64(rapid.IntRange(1, 1000).Draw(t, "demand"))
		}
		p := priceShares(sizes, d, maxPricingRounds)
		if p == nil {
			t.Fatalf("no prices for %v %v", sizes, d)
		}
		var worth float64
		for i, s := range sizes {
			if p.price[s] < -1e-9 {
				t.Fatalf("negative price %v for %d", p.price[s], s)
			}
			worth += d[i] * p.price[s]
		}
		if p.val[1000] > 1+1e-6 {
			t.Fatalf("a pattern is worth %v GPUs", p.val[1000])
		}
		bins, err := primalBins(sizes, d)
		if err != nil {
			t.Fatalf("primal LP for %v %v: %v", sizes, d, err)
		}
		if math.Abs(bins-worth) > 1e-6*max(1, bins) {
			t.Fatalf("sizes %v demand %v: dual worth %v, primal %v GPUs", sizes, d, worth, bins)
		}
		// Stopped before convergence, the prices are scaled down to stay
		// feasible: still no pattern worth more than a GPU.
		if q := priceShares(sizes, d, 0); q == nil || q.val[1000] > 1+1e-6 {
			t.Fatalf("after one round: %v", q)
		}
		free := rapid.IntRange(1, 1000).Draw(t, "free")
		milli := rapid.IntRange(1, 999).Draw(t, "milli")
		if l := p.loss(free, milli); l < 0 || math.IsNaN(l) {
			t.Fatalf("loss(%d, %d) = %v", free, milli, l)
		}
	})
}

// TestPackingChargeKeepsGapsForTheirPartners is the case from the Alibaba
// trace (DefaultWorkload): a 230-milli share could go into a 650's
// 350-milli gap (best fit: 120 left) or a 470's 530-milli gap. Priced, the
// 350 gap is worth a 320 (1/3 GPU) and the 530 gap two 230s, so the 230
// goes beside the 470 and the 350 gap waits for a 320, which then fills it
// to 970. Without the charge the fragmentation policy takes the 350 gap.
func TestPackingChargeKeepsGapsForTheirPartners(t *testing.T) {
	mk := func() []*Node {
		a := node("a", 96000, 393216, 1, nil)
		a.GPUModel, a.GPUFreeMilli = "V100M16", []int{350}
		b := node("b", 96000, 393216, 1, nil)
		b.GPUModel, b.GPUFreeMilli = "V100M16", []int{530}
		return []*Node{a, b}
	}
	task := Task{ID: "t", Request: Resources{CPUMillis: 4000, MemoryMiB: 30517, GPUMilli: 230}}
	got, _ := placeOne(t, Options{Policy: PolicyFragmentation}, &Snapshot{Nodes: mk()}, task)
	if got != "b" {
		t.Errorf("230 share with the packing charge went to %q, want b (the 470's gap)", got)
	}
	off, _ := placeOne(t, Options{Policy: PolicyFragmentation, PackingWeight: -1}, &Snapshot{Nodes: mk()}, task)
	if off != "a" {
		t.Errorf("230 share without the packing charge went to %q, want a (tightest gap)", off)
	}
	// The charge works per GPU too: one node holding both gaps.
	n := node("n", 96000, 393216, 2, nil)
	n.GPUModel, n.GPUFreeMilli = "V100M16", []int{350, 530}
	_, p := placeOne(t, Options{Policy: PolicyFragmentation}, &Snapshot{Nodes: []*Node{n}}, task)
	if g := p.Placements[0].GPUIndices; len(g) != 1 || g[0] != 1 {
		t.Errorf("230 share on a node with gaps 350 and 530: GPUs %v, want [1]", g)
	}
	// A 320 still takes the 350 gap (loss 0 there: 650+320 is optimal).
	task.Request.GPUMilli = 320
	if got, _ := placeOne(t, Options{Policy: PolicyFragmentation}, &Snapshot{Nodes: mk()}, task); got != "a" {
		t.Errorf("320 share went to %q, want a", got)
	}
}

// TestSharePricesDegenerateWorkload: 24-size workloads on which gonum's
// lp.Simplex (steepest reduced cost, no iteration bound) never returned or
// took seconds, found by review. Bland's rule terminates, at the LP
// optimum.
func TestSharePricesDegenerateWorkload(t *testing.T) {
	small := []int{104, 108, 126, 130, 146, 155, 159, 164, 168, 175, 195, 204, 205, 210, 216, 232, 246, 255, 259, 263, 264, 267, 280, 282}
	sq := make([]float64, len(small))
	var total float64
	for i, s := range small {
		sq[i] = float64(s * s)
		total += sq[i] * float64(s) / 1000
	}
	// These sizes pack perfectly in the fractional relaxation: the
	// optimum is the total size.
	p := priceShares(small, sq, maxPricingRounds)
	var worth float64
	for i, s := range small {
		worth += sq[i] * p.price[s]
	}
	if math.Abs(worth-total) > 1e-6*total || p.val[1000] > 1+1e-6 {
		t.Errorf("sizes 104-282, demand s²: dual worth %v, want the size bound %v; val(1000) %v", worth, total, p.val[1000])
	}

	sizes := []int{100, 120, 140, 160, 180, 190, 210, 220, 230, 260, 270, 290, 300, 320, 360, 400, 410, 420, 430, 440, 450, 460, 470, 490}
	d := []float64{84, 444, 768, 157, 757, 182, 71, 893, 749, 107, 237, 506, 347, 293, 292, 86, 19, 738, 257, 6, 481, 50, 242, 901}
	p2 := priceShares(sizes, d, maxPricingRounds)
	if p2 == nil || p2.val[1000] > 1+1e-6 {
		t.Fatalf("prices %v", p2)
	}
	// The LP optimum (the dual's worth, if the solve converged) is at
	// least the total size; a solve stopped early and scaled down would
	// fall below it.
	var worth2, total2 float64
	for i, s := range sizes {
		worth2 += d[i] * p2.price[s]
		total2 += d[i] * float64(s) / 1000
	}
	if worth2 < total2-1e-6 {
		t.Errorf("sizes 100-490: dual worth %v below the size bound %v", worth2, total2)
	}
}

// TestPackingChargeBadWeights: weights outside any sensible range, in the
// options or the workload, still give a plan (an infinite charge once made
// every normalised score NaN and Place panic; a NaN workload weight made
// the LP loop).
func TestPackingChargeBadWeights(t *testing.T) {
	n := node("n", 64000, 262144, 2, nil)
	n.GPUModel, n.GPUFreeMilli = "A100", []int{350, 530}
	task := Task{ID: "t", Request: Resources{CPUMillis: 1000, MemoryMiB: 1024, GPUMilli: 230}}
	for _, w := range []float64{math.Inf(1), 1e307, math.NaN(), math.Inf(-1)} {
		got, _ := placeOne(t, Options{Policy: PolicyFragmentation, PackingWeight: w, ScarcityWeight: w}, &Snapshot{Nodes: []*Node{n}}, task)
		if got != "n" {
			t.Errorf("PackingWeight %v: placed on %q, want n", w, got)
		}
	}
	wl := []WorkloadClass{
		{Request: Resources{GPUMilli: 300}, Weight: math.NaN()},
		{Request: Resources{GPUMilli: 600}, Weight: math.Inf(1)},
		{Request: Resources{GPUMilli: 470}, Weight: 2},
	}
	if got, _ := placeOne(t, Options{Policy: PolicyFragmentation, Workload: wl}, &Snapshot{Nodes: []*Node{n}}, task); got != "n" {
		t.Errorf("workload with NaN and Inf weights: placed on %q, want n", got)
	}
}
