package federation

import (
	"strings"
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/priority"
	"apiary.dev/apiary/internal/sovereignty"
)

func TestEligibleOrderAndExclusions(t *testing.T) {
	pol, err := sovereignty.Parse([]byte(sovereignty.DefaultYAML))
	if err != nil {
		t.Fatal(err)
	}
	reg := func(name, jur string, up bool, freeCPU int64, pending int64) Region {
		return Region{Name: name, Jurisdiction: jur, Up: up, DownReason: "test", Policy: pol.Fingerprint(),
			Labels:   map[string]string{"tier": "standard"},
			Capacity: Capacity{Free: Res{CPUMillis: freeCPU}, Largest: Res{CPUMillis: 4000, MemoryMiB: 8192}},
			Backlog:  []Backlog{{Class: priority.Standard, Pending: pending, Bound: 10}}}
	}
	regions := []Region{reg("eu-a", "eu", true, 100, 0), reg("eu-b", "eu", true, 900, 10), reg("eu-c", "eu", true, 500, 0),
		reg("us-a", "us", true, 5000, 0), reg("eu-down", "eu", false, 9000, 0)}
	ok, ex := Eligible(regions, pol, &apiaryv1.JobSpec{Name: "j", Priority: 50, Jurisdiction: "eu",
		Tasks: []*apiaryv1.TaskGroup{{Resources: &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 64}}}})
	var names []string
	for _, r := range ok {
		names = append(names, r.Name)
	}
	// eu-b has most free cpu but is at its backlog bound: last.
	if want := []string{"eu-c", "eu-a", "eu-b"}; len(names) != 3 || names[0] != want[0] || names[1] != want[1] || names[2] != want[2] {
		t.Fatalf("order %v, want %v", names, want)
	}
	kinds := map[string]string{}
	for _, e := range ex {
		kinds[e.Region] = e.Kind
	}
	if kinds["us-a"] != KindPolicy || kinds["eu-down"] != KindDown {
		t.Fatalf("exclusions %v", ex)
	}
	ok, _ = Eligible(regions, pol, &apiaryv1.JobSpec{Region: &apiaryv1.RegionSpec{Prefer: []string{"eu-a"}},
		Tasks: []*apiaryv1.TaskGroup{{Resources: &apiaryv1.Resources{CpuMillis: 100}}}})
	if ok[0].Name != "eu-a" {
		t.Fatalf("prefer ignored: %v", ok[0].Name)
	}
	_, ex = Eligible(regions, pol, &apiaryv1.JobSpec{Region: &apiaryv1.RegionSpec{Selector: map[string]string{"tier": "gold"}}})
	if len(ex) != len(regions) || ex[0].Kind != KindSelector {
		t.Fatalf("selector: %v", ex)
	}
	ok, ex = Eligible(regions[:1], pol, &apiaryv1.JobSpec{Tasks: []*apiaryv1.TaskGroup{{Resources: &apiaryv1.Resources{MemoryMb: 9000}}}})
	if len(ok) != 0 || ex[0].Kind != KindCapacity {
		t.Fatalf("too large: %v %v", ok, ex)
	}
	// A region that is up with another policy (or none) is never routed
	// to: its own re-check and placement would apply another rule.
	other, err := sovereignty.Parse([]byte(strings.Replace(sovereignty.DefaultYAML, "allow: [ch, eu]", "allow: [ch]", 1)))
	if err != nil {
		t.Fatal(err)
	}
	lax, none := reg("eu-lax", "eu", true, 100, 0), reg("eu-none", "eu", true, 100, 0)
	lax.Policy, none.Policy = other.Fingerprint(), ""
	if lax.Policy == pol.Fingerprint() {
		t.Fatal("two policies share a fingerprint")
	}
	ok, ex = Eligible([]Region{lax, none, regions[0]}, pol, &apiaryv1.JobSpec{Tasks: []*apiaryv1.TaskGroup{{Resources: &apiaryv1.Resources{CpuMillis: 100}}}})
	if len(ok) != 1 || ok[0].Name != "eu-a" || len(ex) != 2 || ex[0].Kind != KindPolicy || !strings.Contains(ex[0].Detail, "another sovereignty policy") ||
		!strings.Contains(ex[1].Detail, "fingerprint none") {
		t.Fatalf("policy mismatch: ok %v, excluded %v", ok, ex)
	}
}
