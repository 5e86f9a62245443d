package ids

import (
	"strings"
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

// TimeOf reads back NewJobID's time; Floor sorts between the ids of the
// millisecond before and those of its own.
func TestTimeOfAndFloor(t *testing.T) {
	for _, ms := range []int64{0, 1, 1_800_000_000_000, 1_800_000_000_001, 1<<48 - 1} {
		at := time.UnixMilli(ms)
		id := NewJobID("eu-west", at)
		if got, ok := TimeOf(id); !ok || got != ms {
			t.Fatalf("TimeOf(%s) = %d, %v; want %d", id, got, ok, ms)
		}
		f := Floor("eu-west", ms)
		if !IsJobID(f) || f > id {
			t.Fatalf("Floor(%d) = %q: not an id shape or above %s", ms, f, id)
		}
		if ms > 0 {
			if before := NewJobID("eu-west", at.Add(-time.Millisecond)); before >= f {
				t.Fatalf("an id of the millisecond before, %s, is not below Floor(%d) = %s", before, ms, f)
			}
		}
	}
	if _, ok := TimeOf("garbage"); ok {
		t.Fatal("TimeOf(garbage) ok")
	}
	if Floor("r", -5) != Floor("r", 0) || Floor("r", 1<<50) != Floor("r", 1<<48-1) {
		t.Fatal("Floor does not clamp")
	}
}

// Between splits a range of ids of one region, below a millisecond too,
// until the two ends are adjacent.
func TestBetween(t *testing.T) {
	at := time.UnixMilli(1_800_000_000_000)
	a, b := Floor("eu-west", at.UnixMilli()), Floor("eu-west", at.UnixMilli()+1)
	steps := 0
	for {
		m, ok := Between(a, b)
		if !ok {
			break
		}
		if !(a < m && m < b) || !IsJobID(m) || RegionOf(m) != "eu-west" {
			t.Fatalf("Between(%s, %s) = %s", a, b, m)
		}
		if ms, _ := TimeOf(m); ms != at.UnixMilli() {
			t.Fatalf("Between two floors a millisecond apart left it: %s at %d", m, ms)
		}
		a = m
		steps++
	}
	if steps != 52 {
		t.Fatalf("%d halvings from one millisecond's floor to the next; want 52 (its random bits)", steps)
	}
	for _, c := range [][2]string{{"garbage", "eu-west-06h3z3msn7jhge3tc3ej"}, {b, a}, {a, a},
		{"eu-06h3z3msn7jhge3tc3ej", "eu-west-06h3z3msn7jhge3tc3ej"}} {
		if m, ok := Between(c[0], c[1]); ok {
			t.Fatalf("Between(%q, %q) = %q", c[0], c[1], m)
		}
	}
}

// CheckPageToken takes "" and job ids, and names the field for anything
// else, quoting at most 64 bytes of it.
func TestCheckPageToken(t *testing.T) {
	if CheckPageToken("") != nil || CheckPageToken(NewJobID("eu-west", time.Now())) != nil {
		t.Fatal("a job id or no token refused")
	}
	err := CheckPageToken(strings.Repeat("x", 300))
	if err == nil || !strings.HasPrefix(err.Error(), "page_token: ") || !strings.Contains(err.Error(), `"`+strings.Repeat("x", 64)+`..."`) {
		t.Fatalf("a 300-byte token: %v", err)
	}
}
