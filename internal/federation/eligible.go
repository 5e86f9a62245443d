package federation

import (
	"fmt"
	"sort"
	"strings"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/priority"
	"apiary.dev/apiary/internal/sovereignty"
)

// Exclusion kinds: why a region cannot take a job.
const (
	KindSelector = "selector" // region labels do not match the job's region.selector
	KindPolicy   = "policy"   // the sovereignty policy forbids the region's jurisdiction
	KindDown     = "down"     // no coordinator alive and answering
	KindCapacity = "capacity" // a task is larger than the region's largest node
	KindRefused  = "refused"  // the region refused the job before accepting it
)

// Exclusion is one region left out of a routing decision, and why.
type Exclusion struct {
	Region string
	Kind   string
	Detail string
}

func (e Exclusion) String() string { return fmt.Sprintf("%s: %s: %s", e.Region, e.Kind, e.Detail) }

// Eligible returns the regions that may take spec, best first, and every
// other region with the reason it was excluded. Order: regions named in
// spec.region.prefer in that order, then regions whose backlog for the job's
// priority class is below its bound before those at or over it, then most
// free CPU, then most free memory, then name. Where a job may run is
// sovereignty.Resolve's answer, the same function the region's admission and
// placement use; pol may be nil (sovereignty.RuleNoPolicy).
func Eligible(regions []Region, pol *sovereignty.Policy, spec *apiaryv1.JobSpec) ([]Region, []Exclusion) {
	var ok []Region
	var out []Exclusion
	decision := sovereignty.Resolve(pol, spec.GetJurisdiction(), spec.GetDataClass())
	for _, r := range regions {
		if why := selectorMismatch(r, spec.GetRegion().GetSelector()); why != "" {
			out = append(out, Exclusion{r.Name, KindSelector, why})
			continue
		}
		if !decision.Allows(r.Jurisdiction) {
			out = append(out, Exclusion{r.Name, KindPolicy, fmt.Sprintf("jurisdiction %q; %s for data (jurisdiction %q, data_class %q)",
				r.Jurisdiction, decision, spec.GetJurisdiction(), spec.GetDataClass())})
			continue
		}
		if !r.Up {
			out = append(out, Exclusion{r.Name, KindDown, r.DownReason})
			continue
		}
		if fp := pol.Fingerprint(); r.Policy != fp {
			// The region re-checks and places by its own policy: routing
			// there would apply another rule than the one decided here.
			// (Checked only for regions that are up: a down region's tags
			// may be old, and it stays a home candidate.)
			out = append(out, Exclusion{r.Name, KindPolicy, fmt.Sprintf("the region runs another sovereignty policy (fingerprint %s, this router's %s); give every router and region the same --policy file",
				orNone(r.Policy), orNone(fp))})
			continue
		}
		if why := tooLarge(r, spec); why != "" {
			out = append(out, Exclusion{r.Name, KindCapacity, why})
			continue
		}
		ok = append(ok, r)
	}
	prefer := map[string]int{}
	for i, p := range spec.GetRegion().GetPrefer() {
		if _, dup := prefer[p]; !dup {
			prefer[p] = i
		}
	}
	rank := func(r Region) int {
		if i, ok := prefer[r.Name]; ok {
			return i
		}
		return len(prefer)
	}
	class := priority.Of(spec.GetPriority())
	full := func(r Region) bool {
		for _, b := range r.Backlog {
			if b.Class == class && b.Bound > 0 && b.Pending >= b.Bound {
				return true
			}
		}
		return false
	}
	sort.SliceStable(ok, func(a, b int) bool {
		ra, rb := ok[a], ok[b]
		if x, y := rank(ra), rank(rb); x != y {
			return x < y
		}
		if x, y := full(ra), full(rb); x != y {
			return !x
		}
		if x, y := ra.Capacity.Free.CPUMillis, rb.Capacity.Free.CPUMillis; x != y {
			return x > y
		}
		if x, y := ra.Capacity.Free.MemoryMiB, rb.Capacity.Free.MemoryMiB; x != y {
			return x > y
		}
		return ra.Name < rb.Name
	})
	return ok, out
}

func selectorMismatch(r Region, sel map[string]string) string {
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var miss []string
	for _, k := range keys {
		if got, ok := r.Labels[k]; !ok || got != sel[k] {
			if !ok {
				got = "(unset)"
			}
			miss = append(miss, fmt.Sprintf("%s=%s wanted, region has %s", k, sel[k], got))
		}
	}
	if len(miss) == 0 {
		return ""
	}
	return "region.selector: " + strings.Join(miss, "; ")
}

// tooLarge uses the largest node published in the region's tags; regions
// with no registered node yet are not excluded (the region re-checks).
func tooLarge(r Region, spec *apiaryv1.JobSpec) string {
	l := r.Capacity.Largest
	if l.CPUMillis == 0 && l.MemoryMiB == 0 {
		return ""
	}
	for g, grp := range spec.GetTasks() {
		res := grp.GetResources()
		gpus := int64(res.GetGpus())
		if res.GetGpuMilli() > 0 && gpus == 0 {
			gpus = 1
		}
		if res.GetCpuMillis() > l.CPUMillis || res.GetMemoryMb() > l.MemoryMiB || gpus > l.GPUs {
			return fmt.Sprintf("tasks[%d] needs cpu %dm, memory %d MiB, %d GPU(s); largest node has cpu %dm, memory %d MiB, %d GPU(s)",
				g, res.GetCpuMillis(), res.GetMemoryMb(), gpus, l.CPUMillis, l.MemoryMiB, l.GPUs)
		}
	}
	return ""
}

func orNone(fp string) string {
	if fp == "" {
		return "none"
	}
	return fp
}
