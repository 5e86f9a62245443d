package ids

import (
	"testing"
	"time"
)

func TestJobIDCarriesRegionAndSorts(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	a := NewJobID("eu-west", t0)
	b := NewJobID("eu-west", t0.Add(time.Millisecond))
	if RegionOf(a) != "eu-west" || RegionOf(b) != "eu-west" {
		t.Fatalf("RegionOf(%q)=%q", a, RegionOf(a))
	}
	if !(a < b) {
		t.Fatalf("ids must sort by time: %s !< %s", a, b)
	}
	if a == NewJobID("eu-west", t0) {
		t.Fatal("ids must be unique")
	}
	if RegionOf("nodash") != "" || RegionOf("x-short") != "" {
		t.Fatal("RegionOf must reject foreign ids")
	}
}

// IsJobID accepts what NewJobID makes and nothing of another shape.
func TestIsJobID(t *testing.T) {
	for range 100 {
		if id := NewJobID("eu-west-2", time.Now()); !IsJobID(id) {
			t.Fatalf("IsJobID(%q) = false", id)
		}
	}
	for _, bad := range []string{"", "garbage", "eu-west-", "-06h3z3msn7jhge3tc3ej", "EU-06h3z3msn7jhge3tc3ej",
		"eu-06h3z3msn7jhge3tc3eI", "eu-06h3z3msn7jhge3tc3e", "eu-06h3z3msn7jhge3tc3eju", "eu_x-06h3z3msn7jhge3tc3ej", "eu-06h3z3msn7jhge3tc3\x00j"} {
		if IsJobID(bad) {
			t.Fatalf("IsJobID(%q) = true", bad)
		}
	}
}
