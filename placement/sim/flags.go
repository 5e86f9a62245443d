package sim

import (
	"fmt"
	"strconv"
	"strings"

	"apiary.dev/apiary/placement"
)

// AllPolicies are the policies a simulation compares by default.
var AllPolicies = []placement.Policy{
	placement.PolicyRandom, placement.PolicySpread, placement.PolicyBinpack,
	placement.PolicyBestFit, placement.PolicyFragmentation,
}

// ParsePolicies parses "all" or a comma-separated list of policy names.
func ParsePolicies(s string) ([]placement.Policy, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "all" {
		return AllPolicies, nil
	}
	var out []placement.Policy
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		ok := false
		for _, q := range AllPolicies {
			if string(q) == p {
				ok = true
			}
		}
		if !ok {
			return nil, fmt.Errorf("unknown policy %q (want all or a list of random, spread, binpack, bestfit, fragmentation)", p)
		}
		out = append(out, placement.Policy(p))
	}
	return out, nil
}

// ParseSeeds parses "42-51", "42,45,50" or "42".
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
			if err1 != nil || err2 != nil || b < a || b-a > 10000 {
				return nil, fmt.Errorf("bad seed range %q", part)
			}
			for x := a; x <= b; x++ {
				out = append(out, x)
			}
			continue
		}
		x, err := strconv.ParseInt(part, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad seed %q", part)
		}
		out = append(out, x)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no seeds in %q", s)
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
