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
