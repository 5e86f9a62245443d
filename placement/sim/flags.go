package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"apiary.dev/apiary/placement"
)

// AllPolicies are the policies a simulation compares by default.
var AllPolicies = []placement.Policy{
	placement.PolicyRandom, placement.PolicySpread, placement.PolicyBinpack,
	placement.PolicyBestFit, placement.PolicyFragmentation,
}

// ParsePolicies parses "all" or a comma-separated list of policy names,
// each named once.
func ParsePolicies(s string) ([]placement.Policy, error) {
	s = strings.TrimSpace(s)
	if s == "all" {
		return AllPolicies, nil
	}
	var out []placement.Policy
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "all" {
			return nil, fmt.Errorf("policy list %q: all cannot be combined with other policies", s)
		}
		if !slices.Contains(AllPolicies, placement.Policy(p)) {
			return nil, fmt.Errorf("unknown policy %q (want all or a list of random, spread, binpack, bestfit, fragmentation)", p)
		}
		if slices.Contains(out, placement.Policy(p)) {
			return nil, fmt.Errorf("policy %q listed twice", p)
		}
		out = append(out, placement.Policy(p))
	}
	return out, nil
}

// maxSeeds bounds one simulation's seed count.
const maxSeeds = 10000

// ParseSeeds parses "42-51", "42,45,50" or "42", or a comma list of those:
// integers, ranges with start ≤ end, each seed once, at most 10,000.
func ParseSeeds(s string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if lo, hi, ok := strings.Cut(part, "-"); ok && lo != "" {
			a, err1 := strconv.ParseInt(strings.TrimSpace(lo), 10, 64)
			b, err2 := strconv.ParseInt(strings.TrimSpace(hi), 10, 64)
			switch {
			case err1 != nil || err2 != nil:
				return nil, fmt.Errorf("bad seed range %q: want START-END, both integers", part)
			case b < a:
				return nil, fmt.Errorf("bad seed range %q: start %d is after end %d", part, a, b)
			case b-a >= maxSeeds:
				return nil, fmt.Errorf("bad seed range %q: more than %d seeds", part, maxSeeds)
			}
			for x := a; x <= b; x++ {
				out = append(out, x)
			}
			continue
		}
		x, err := strconv.ParseInt(part, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad seed %q: want an integer or a range START-END", part)
		}
		out = append(out, x)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no seeds in %q", s)
	}
	if len(out) > maxSeeds {
		return nil, fmt.Errorf("seeds %q: more than %d seeds", s, maxSeeds)
	}
	seen := make(map[int64]bool, len(out))
	for _, x := range out {
		if seen[x] {
			return nil, fmt.Errorf("seeds %q: seed %d listed twice", s, x)
		}
		seen[x] = true
	}
	return out, nil
}

// Compare runs every policy over every seed with cfg (its Policy and Seed
// are overridden) and summarises per policy.
func Compare(nodes []*placement.Node, trace []placement.Task, policies []placement.Policy, seeds []int64, cfg Config) map[placement.Policy]Summary {
	out := map[placement.Policy]Summary{}
	for _, p := range policies {
		var runs []Result
		for _, s := range seeds {
			c := cfg
			c.Policy, c.Seed = p, s
			runs = append(runs, Run(nodes, trace, c))
		}
		out[p] = Summarize(runs)
	}
	return out
}
