package nodehealth

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

const t0 int64 = 1_700_000_000_000

var (
	def    = DefaultConfig()
	minute = time.Minute.Milliseconds()
)

func ok(at int64, job string) Outcome   { return Outcome{AtMs: at, Job: job} }
func fail(at int64, job string) Outcome { return Outcome{AtMs: at, Job: job, Failed: true} }

// observed is a record that saw outs, each observed at its own time.
func observed(c Config, outs ...Outcome) Record {
	var r Record
	for _, o := range outs {
		r = r.Observe(c, o, o.AtMs)
	}
	return r
}

// deepCopy copies r, its window and quarantine included.
func deepCopy(r Record) Record {
	r.Window = slices.Clone(r.Window)
	if r.Quarantine != nil {
		q := *r.Quarantine
		r.Quarantine = &q
	}
	return r
}

// ---- Config ---------------------------------------------------------------------

func TestWithDefaults(t *testing.T) {
	if got := (Config{}).WithDefaults(); !reflect.DeepEqual(got, DefaultConfig()) {
		t.Fatalf("zero config: %+v, want DefaultConfig %+v", got, DefaultConfig())
	}
	d := DefaultConfig()
	if d.Window != 10*time.Minute || d.MaxEntries != 32 || d.Recent != 10 || d.MinFailures != 3 || d.MinJobs != 2 ||
		d.MinRate != 0.5 || d.RateFactor != 3 || d.ProbeAfter != time.Minute || d.MaxProbeAfter != time.Hour ||
		d.StrikeReset != time.Hour || d.MaxShare != 0.25 || d.Off {
		t.Errorf("DefaultConfig changed from the documented values: %+v", d)
	}
	set := Config{Window: time.Minute, MaxEntries: 8, Recent: 4, MinFailures: 5, MinJobs: 3, MinRate: 0.7, RateFactor: 2,
		ProbeAfter: time.Second, MaxProbeAfter: time.Minute, StrikeReset: time.Second, MaxShare: 0.5, Off: true}
	if got := set.WithDefaults(); !reflect.DeepEqual(got, set) {
		t.Errorf("set fields overwritten: %+v, want %+v", got, set)
	}
	// Recent is at most MaxEntries; MaxProbeAfter at least ProbeAfter.
	got := Config{MaxEntries: 5, Recent: 20, ProbeAfter: 2 * time.Hour}.WithDefaults()
	if got.Recent != 5 || got.MaxProbeAfter != 2*time.Hour {
		t.Errorf("Recent %d (want MaxEntries 5), MaxProbeAfter %s (want ProbeAfter 2h)", got.Recent, got.MaxProbeAfter)
	}
	if got := (Config{MaxEntries: 5}).WithDefaults(); got.Recent != 5 {
		t.Errorf("default Recent with MaxEntries 5: %d, want 5", got.Recent)
	}
	// Negative values take the defaults too.
	if got := (Config{Window: -time.Second, MaxEntries: -1, MinRate: -1, MaxShare: -1}).WithDefaults(); got.Window != d.Window ||
		got.MaxEntries != d.MaxEntries || got.MinRate != d.MinRate || got.MaxShare != d.MaxShare {
		t.Errorf("negative fields: %+v", got)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{{}, DefaultConfig(), {MaxShare: 1}, {Window: time.Second}, {Off: true}} {
		if err := c.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", c, err)
		}
	}
	for _, c := range []struct {
		name string
		c    Config
		want []string
	}{
		{"negative window", Config{Window: -time.Second}, []string{"--quarantine-window", "must not be negative"}},
		{"negative probe-after", Config{ProbeAfter: -time.Second}, []string{"--quarantine-probe-after", "must not be negative"}},
		// The message lists --quarantine-window and --quarantine-probe-after,
		// not --quarantine-max-probe-after (see the report).
		{"negative max-probe-after", Config{MaxProbeAfter: -time.Second}, []string{"must not be negative"}},
		{"share below 0", Config{MaxShare: -0.1}, []string{"--quarantine-max-share", "between 0 and 1", "got -0.1"}},
		{"share above 1", Config{MaxShare: 1.5}, []string{"--quarantine-max-share", "between 0 and 1", "got 1.5"}},
		{"window under 1s", Config{Window: 500 * time.Millisecond}, []string{"--quarantine-window", "at least 1s", "got 500ms"}},
	} {
		err := c.c.Validate()
		if err == nil {
			t.Errorf("%s: Validate = nil", c.name)
			continue
		}
		for _, s := range c.want {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q does not contain %q", c.name, err, s)
			}
		}
	}
}

// ---- window ---------------------------------------------------------------------

func TestObserveTrimsByAge(t *testing.T) {
	c := Config{Window: 10 * time.Minute}
	// One outcome a minute for 15 minutes.
	var r Record
	for i := int64(0); i < 15; i++ {
		r = r.Observe(c, ok(t0+i*minute, "j"), t0+i*minute)
	}
	if len(r.Window) != 11 || r.Window[0].AtMs != t0+4*minute || r.Window[10].AtMs != t0+14*minute {
		t.Fatalf("window after 15 min: %d entries from %d to %d; want 11 (the last 10 min, bounds included)",
			len(r.Window), (r.Window[0].AtMs-t0)/minute, (r.Window[len(r.Window)-1].AtMs-t0)/minute)
	}
	// The bound: an outcome exactly Window old still counts, 1 ms older not.
	now := t0 + 14*minute + 10*minute
	if got := r.Totals(c, now); got.Attempts != 1 {
		t.Errorf("Totals at exactly Window after the last: %d attempts, want 1", got.Attempts)
	}
	if got := r.Totals(c, now+1); got.Attempts != 0 {
		t.Errorf("Totals 1ms later: %d attempts, want 0", got.Attempts)
	}
	// Observe trims what aged out, even when the new outcome is the only one left.
	r2 := r.Observe(c, fail(now+1, "j"), now+1)
	if len(r2.Window) != 1 || !r2.Window[0].Failed {
		t.Errorf("Observe after everything aged out: %+v, want the new outcome only", r2.Window)
	}
	// Totals and Recent read only the live part of a stored window.
	if got := r.Recent(c, t0+20*minute); got.Attempts != 5 {
		t.Errorf("Recent at +20 min: %d attempts, want 5 (minutes 10..14)", got.Attempts)
	}
}

func TestObserveTrimsToMaxEntries(t *testing.T) {
	for _, max := range []int{0, 1, 5} {
		c := Config{MaxEntries: max}
		want := c.WithDefaults().MaxEntries
		var r Record
		for i := int64(0); i < 40; i++ {
			r = r.Observe(c, Outcome{AtMs: t0 + i, Job: fmt.Sprint(i), Failed: i%2 == 0}, t0+i)
			if len(r.Window) > want {
				t.Fatalf("MaxEntries %d: window of %d", max, len(r.Window))
			}
		}
		if len(r.Window) != want || r.Window[0].AtMs != t0+40-int64(want) || r.Window[want-1].AtMs != t0+39 {
			t.Errorf("MaxEntries %d: %d entries from +%d; want the latest %d", max, len(r.Window), r.Window[0].AtMs-t0, want)
		}
	}
}

func TestObserveDoesNotModifyItsInput(t *testing.T) {
	backing := make([]Outcome, 3, 10)
	for i := range backing {
		backing[i] = ok(t0+int64(i), "j")
	}
	r := Record{Window: backing, Strikes: 2, ReleasedMs: t0 - 1}
	was := deepCopy(r)
	got := r.Observe(def, fail(t0+5, "k"), t0+5)
	if !reflect.DeepEqual(r, was) || backing[:4][3] != (Outcome{}) {
		t.Fatalf("Observe wrote into its input: %+v, spare %+v", r, backing[:4][3])
	}
	if len(got.Window) != 4 || got.Window[3] != fail(t0+5, "k") || got.Strikes != 2 || got.ReleasedMs != t0-1 {
		t.Fatalf("Observe result: %+v", got)
	}
}

func TestStats(t *testing.T) {
	r := observed(def, ok(t0, "a"), fail(t0+10, "b"), ok(t0+20, "c"), fail(t0+30, "b"), fail(t0+5_000, "d"), ok(t0+6_000, "e"))
	s := r.Totals(def, t0+6_000)
	want := Stats{Attempts: 6, Failures: 3, Jobs: 2, FirstFailMs: t0 + 10, LastFailMs: t0 + 5_000}
	if s != want {
		t.Fatalf("Totals = %+v, want %+v (jobs counts distinct failing jobs only)", s, want)
	}
	if s.Rate() != 0.5 {
		t.Errorf("Rate = %v, want 0.5", s.Rate())
	}
	if (Stats{}).Rate() != 0 {
		t.Errorf("Rate without attempts = %v, want 0", (Stats{}).Rate())
	}
	if s := (Record{}).Recent(def, t0); s != (Stats{}) {
		t.Errorf("Recent of an empty record = %+v", s)
	}
}

func TestRecentUsesTheLastRecentOutcomes(t *testing.T) {
	c := DefaultConfig() // Recent 10, MaxEntries 32
	var outs []Outcome
	for i := int64(0); i < 30; i++ {
		outs = append(outs, ok(t0+i*1000, fmt.Sprintf("j%d", i%3)))
	}
	for i := int64(0); i < 5; i++ {
		outs = append(outs, fail(t0+30_000+i*1000, []string{"x", "y"}[i%2]))
	}
	r := observed(c, outs...)
	now := t0 + 35_000
	if got := r.Recent(c, now); got.Attempts != 10 || got.Failures != 5 || got.Jobs != 2 ||
		got.FirstFailMs != t0+30_000 || got.LastFailMs != t0+34_000 {
		t.Errorf("Recent = %+v, want the last 10: 5 failures of 2 jobs", got)
	}
	if got := r.Totals(c, now); got.Attempts != 32 || got.Failures != 5 {
		t.Errorf("Totals = %+v, want the whole window: 32 attempts, 5 failures", got)
	}
	// Fewer outcomes than Recent: all of them.
	few := observed(c, ok(t0, "a"), fail(t0+1, "b"))
	if got := few.Recent(c, t0+1); got.Attempts != 2 || got.Failures != 1 {
		t.Errorf("Recent of 2 outcomes = %+v", got)
	}
	// Outcomes that aged out do not count, even among the last Recent.
	c.Window = time.Minute
	old := observed(c, fail(t0, "a"), fail(t0+1, "b"), ok(t0+50_000, "c"))
	if got := old.Recent(c, t0+61_000); got.Attempts != 1 || got.Failures != 0 {
		t.Errorf("Recent past the window = %+v, want the one live success", got)
	}
}

// ---- Outlier --------------------------------------------------------------------

func TestOutlier(t *testing.T) {
	none := Stats{}
	healthy := Stats{Attempts: 200, Failures: 10} // 5%
	cases := []struct {
		name       string
		c          Config
		node, rest Stats
		want       bool
	}{
		{"3 failures of 2 jobs, all recent attempts", def, Stats{Attempts: 3, Failures: 3, Jobs: 2}, healthy, true},
		{"2 failures (< MinFailures 3)", def, Stats{Attempts: 2, Failures: 2, Jobs: 2}, healthy, false},
		{"10 failures of one job", def, Stats{Attempts: 10, Failures: 10, Jobs: 1}, none, false},
		{"4 of 10 (rate < MinRate 0.5)", def, Stats{Attempts: 10, Failures: 4, Jobs: 3}, none, false},
		{"5 of 10 (rate = MinRate)", def, Stats{Attempts: 10, Failures: 5, Jobs: 2}, none, true},
		// The rest's rate is smoothed: failures / (attempts + RestPrior).
		{"rest fails 40% of 100: 100% < 3 x 40/110", def, Stats{Attempts: 10, Failures: 10, Jobs: 5}, Stats{Attempts: 100, Failures: 40}, false},
		{"rest fails 40% of 1000", def, Stats{Attempts: 10, Failures: 10, Jobs: 5}, Stats{Attempts: 1000, Failures: 400}, false},
		{"rest fails 40% of 60: 100% < 3 x 24/70", def, Stats{Attempts: 10, Failures: 10, Jobs: 5}, Stats{Attempts: 60, Failures: 24}, false},
		{"rest fails 40% of 50: 100% = 3 x 20/60", def, Stats{Attempts: 10, Failures: 10, Jobs: 5}, Stats{Attempts: 50, Failures: 20}, true},
		{"rest fails 40% of 5: the prior outweighs it", def, Stats{Attempts: 10, Failures: 10, Jobs: 5}, Stats{Attempts: 5, Failures: 2}, true},
		{"rest failed its only attempt", def, Stats{Attempts: 4, Failures: 3, Jobs: 2}, Stats{Attempts: 1, Failures: 1}, true},
		{"rate = RateFactor x smoothed rest (0.75 = 3 x 10/40)", def, Stats{Attempts: 4, Failures: 3, Jobs: 2}, Stats{Attempts: 30, Failures: 10}, true},
		{"rate < RateFactor x smoothed rest (0.75 < 3 x 6/16)", def, Stats{Attempts: 4, Failures: 3, Jobs: 2}, Stats{Attempts: 6, Failures: 6}, false},
		{"rest without attempts", def, Stats{Attempts: 6, Failures: 3, Jobs: 3}, none, true},
		{"MinFailures 5: 4 failures", Config{MinFailures: 5}, Stats{Attempts: 4, Failures: 4, Jobs: 4}, healthy, false},
		{"MinJobs 3: 2 jobs", Config{MinJobs: 3}, Stats{Attempts: 10, Failures: 10, Jobs: 2}, healthy, false},
		{"MinJobs 3: 3 jobs", Config{MinJobs: 3}, Stats{Attempts: 10, Failures: 10, Jobs: 3}, healthy, true},
		{"MinRate 0.9: 8 of 10", Config{MinRate: 0.9}, Stats{Attempts: 10, Failures: 8, Jobs: 2}, none, false},
		{"RateFactor 1.5: 0.6 vs 45/100", Config{RateFactor: 1.5}, Stats{Attempts: 10, Failures: 6, Jobs: 2}, Stats{Attempts: 90, Failures: 45}, false},
		{"RateFactor 1.5: 0.8 vs 45/100", Config{RateFactor: 1.5}, Stats{Attempts: 10, Failures: 8, Jobs: 2}, Stats{Attempts: 90, Failures: 45}, true},
	}
	for _, c := range cases {
		got, reason := Outlier(c.c, c.node, c.rest)
		if got != c.want || (reason != "") != got {
			t.Errorf("%s: Outlier = %v %q, want %v (a reason iff an outlier)", c.name, got, reason, c.want)
		}
	}
}

func TestOutlierReason(t *testing.T) {
	for _, c := range []struct {
		node, rest Stats
		want       string
	}{
		{Stats{Attempts: 10, Failures: 5, Jobs: 3, FirstFailMs: t0, LastFailMs: t0 + 60_000}, Stats{Attempts: 200, Failures: 10},
			"5 failures of 3 jobs in 1m0s (5 of its last 10 attempts; the rest of the region failed 5% of 200)"},
		{Stats{Attempts: 3, Failures: 3, Jobs: 2, FirstFailMs: t0, LastFailMs: t0 + 400}, Stats{},
			"3 failures of 2 jobs in under 1s (3 of its last 3 attempts; the rest of the region has no outcomes yet)"},
		{Stats{Attempts: 4, Failures: 4, Jobs: 4, FirstFailMs: t0, LastFailMs: t0 + 90_400}, Stats{Attempts: 3, Failures: 1},
			"4 failures of 4 jobs in 1m30s (4 of its last 4 attempts; the rest of the region failed 33% of 3)"},
	} {
		out, reason := Outlier(def, c.node, c.rest)
		if !out || reason != c.want {
			t.Errorf("Outlier(%+v, %+v) = %v %q, want %q", c.node, c.rest, out, reason, c.want)
		}
	}
}

// A node healthy for a long time stands out within Recent outcomes of
// breaking, though its whole window is still mostly successes.
func TestOutlierAfterALongHealthyRun(t *testing.T) {
	c := DefaultConfig()
	rest := Stats{Attempts: 1000, Failures: 20}
	var r Record
	at := t0
	for i := 0; i < 30; i++ {
		at += 1000
		r = r.Observe(c, ok(at, fmt.Sprintf("j%d", i%4)), at)
	}
	for i := 1; i <= 5; i++ {
		at += 1000
		r = r.Observe(c, fail(at, []string{"x", "y"}[i%2]), at)
		out, reason := Outlier(c, r.Recent(c, at), rest)
		if out != (i == 5) {
			t.Fatalf("after %d failures: outlier %v, want %v (Recent %+v)", i, out, i == 5, r.Recent(c, at))
		}
		if i == 5 && !strings.HasPrefix(reason, "5 failures of 2 jobs in 4s (5 of its last 10 attempts") {
			t.Errorf("reason %q", reason)
		}
		if whole, _ := Outlier(c, r.Totals(c, at), rest); whole {
			t.Fatalf("after %d failures: an outlier over the whole window (%+v)", i, r.Totals(c, at))
		}
	}
}

// ---- Judge ----------------------------------------------------------------------

func TestJudge(t *testing.T) {
	now := t0 + 10_000
	healthy := Stats{Attempts: 500, Failures: 5}
	twoFailures := observed(def, fail(t0, "a"), fail(t0+1000, "b"))
	mixed := observed(def, ok(t0, "a"), fail(t0+1000, "a"), fail(t0+2000, "b"))
	quarantined := Record{Quarantine: &Quarantine{SinceMs: t0, Reason: "r", ProbeAtMs: now + minute}}
	oneJob := observed(def, ok(t0, "a"))
	for i := int64(1); i <= 10; i++ {
		oneJob = oneJob.Observe(def, fail(t0+i, "bad"), t0+i)
	}
	cases := []struct {
		name  string
		c     Config
		r     Record
		job   string
		rest  Stats
		guard bool
		want  Verdict
	}{
		{"empty window", def, Record{}, "a", healthy, true, NotBlamed},
		{"a recent success proves nothing", def, observed(def, ok(t0, "a")), "b", healthy, true, NotBlamed},
		{"a recent success among failures", def, observed(def, fail(t0, "a"), ok(t0+1, "b"), fail(t0+2, "a")), "a", healthy, true, NotBlamed},
		{"only failures, not an outlier yet", def, observed(def, fail(t0, "a")), "b", healthy, true, NotBlamed},
		{"this failure tips it, guard allows", def, twoFailures, "c", healthy, true, Faulty},
		{"this failure tips it, guard refuses", def, twoFailures, "c", healthy, false, NotBlamed},
		{"tips it with a success in the window, guard allows", def, mixed, "c", healthy, true, Faulty},
		{"tips it with a success in the window, guard refuses", def, mixed, "c", healthy, false, NotBlamed},
		{"would tip it but the rest fails too", def, twoFailures, "c", Stats{Attempts: 100, Failures: 50}, true, NotBlamed},
		{"third failure of the same job as both others", def, observed(def, fail(t0, "a"), fail(t0+1, "a")), "a", healthy, true, NotBlamed},
		{"success older than the last Recent outcomes", def, oneJob, "bad", healthy, true, NotBlamed},
		{"success older than the window", Config{Window: time.Second}, observed(def, ok(t0, "a")), "b", healthy, true, NotBlamed},
		{"quarantined", def, quarantined, "a", healthy, true, Faulty},
		{"quarantined, guard refuses", def, quarantined, "a", healthy, false, Faulty},
		{"quarantined with a recent success", def, Record{Window: []Outcome{ok(now-1, "a")}, Quarantine: quarantined.Quarantine}, "a", healthy, true, Faulty},
		{"off: still quarantined from before (its canary decides)", Config{Off: true}, quarantined, "a", healthy, true, Faulty},
		{"off: tips it", Config{Off: true}, twoFailures, "c", healthy, true, NotBlamed},
		{"off: empty window", Config{Off: true}, Record{}, "a", healthy, true, NotBlamed},
	}
	for _, c := range cases {
		was := deepCopy(c.r)
		if got := Judge(c.c, c.r, c.job, c.rest, c.guard, now); got != c.want {
			t.Errorf("%s: Judge = %d, want %d", c.name, got, c.want)
		}
		if !reflect.DeepEqual(c.r, was) {
			t.Errorf("%s: Judge modified the record", c.name)
		}
	}
}

// ---- Apply ----------------------------------------------------------------------

func TestApplyQuarantines(t *testing.T) {
	now := t0 + 20_000
	healthy := Stats{Attempts: 500, Failures: 5}
	r := observed(def, ok(t0, "a"), fail(t0+5_000, "a"), fail(t0+10_000, "b"))
	r.Strikes, r.ReleasedMs = 0, 0
	was := deepCopy(r)

	got, ev, reason := Apply(def, r, fail(now, "c"), now-5_000, healthy, true, now)
	if ev != Quarantined {
		t.Fatalf("event %d, want Quarantined", ev)
	}
	if !reflect.DeepEqual(r, was) {
		t.Fatalf("Apply modified its input: %+v", r)
	}
	wantReason := "3 failures of 3 jobs in 15s (3 of its last 4 attempts; the rest of the region failed 1% of 500)"
	if reason != wantReason {
		t.Errorf("reason %q, want %q", reason, wantReason)
	}
	q := got.Quarantine
	if q == nil || q.SinceMs != now || q.Reason != reason || q.ProbeAtMs != now+def.ProbeAfter.Milliseconds() || got.Strikes != 1 {
		t.Fatalf("quarantine %+v strikes %d; want since now, probe at now+1m, strikes 1", q, got.Strikes)
	}
	if len(got.Window) != 4 || got.Window[3] != fail(now, "c") {
		t.Errorf("window %+v, want the outcome counted", got.Window)
	}

	// The share guard refuses: counted, not quarantined.
	got, ev, reason = Apply(def, r, fail(now, "c"), now-5_000, healthy, false, now)
	if ev != Refused || reason != wantReason || got.Quarantine != nil || got.Strikes != 0 || len(got.Window) != 4 {
		t.Errorf("guard refuses: event %d reason %q quarantine %+v strikes %d window %d; want Refused, same reason, none, 0, 4",
			ev, reason, got.Quarantine, got.Strikes, len(got.Window))
	}

	for _, c := range []struct {
		name string
		c    Config
		r    Record
		o    Outcome
		rest Stats
	}{
		{"a success", def, r, ok(now, "c"), healthy},
		{"not an outlier", def, observed(def, ok(t0, "a"), fail(t0+1, "b")), fail(now, "c"), healthy},
		{"failures of one job", def, observed(def, fail(t0, "a"), fail(t0+1, "a")), fail(now, "a"), healthy},
		{"the rest fails at 40%", def, r, fail(now, "c"), Stats{Attempts: 100, Failures: 40}},
		{"off", Config{Off: true}, r, fail(now, "c"), healthy},
	} {
		got, ev, reason := Apply(c.c, c.r, c.o, now-1, c.rest, true, now)
		if ev != None || reason != "" || got.Quarantine != nil || got.Strikes != 0 {
			t.Errorf("%s: event %d reason %q quarantine %+v strikes %d; want None", c.name, ev, reason, got.Quarantine, got.Strikes)
		}
		if n := len(got.Window); n != len(c.r.Window)+1 || got.Window[n-1] != c.o {
			t.Errorf("%s: outcome not counted: %+v", c.name, got.Window)
		}
	}
}

// quarantinedAt is a record quarantined at since (one strike), its canary
// due at since+ProbeAfter.
func quarantinedAt(c Config, since int64) Record {
	c = c.WithDefaults()
	r := observed(c, fail(since-2, "a"), fail(since-1, "b"), fail(since, "c"))
	r, ev, _ := Apply(c, r, fail(since, "d"), since-1, Stats{}, true, since)
	if ev != Quarantined {
		panic(fmt.Sprintf("setup: event %d", ev))
	}
	return r
}

func TestApplyWhileQuarantined(t *testing.T) {
	c := Config{ProbeAfter: time.Minute, MaxProbeAfter: 5 * time.Minute, StrikeReset: time.Hour}
	since := t0
	q := quarantinedAt(c, since)
	probeAt := since + minute
	if q.Quarantine.ProbeAtMs != probeAt || q.Strikes != 1 {
		t.Fatalf("setup: %+v strikes %d", q.Quarantine, q.Strikes)
	}
	healthy := Stats{Attempts: 100}

	t.Run("attempts assigned before the probe time do nothing to the quarantine", func(t *testing.T) {
		for _, o := range []Outcome{ok(probeAt+10_000, "e"), fail(probeAt+10_000, "e")} {
			got, ev, reason := Apply(c, q, o, probeAt-1, healthy, true, probeAt+10_000)
			if ev != None || reason != "" || !reflect.DeepEqual(got.Quarantine, q.Quarantine) || got.Strikes != 1 || got.ReleasedMs != 0 {
				t.Errorf("failed=%v: event %d quarantine %+v strikes %d", o.Failed, ev, got.Quarantine, got.Strikes)
			}
			if n := len(got.Window); got.Window[n-1] != o {
				t.Errorf("failed=%v: outcome not counted", o.Failed)
			}
		}
	})
	t.Run("canary success releases", func(t *testing.T) {
		now := probeAt + 30_000
		got, ev, _ := Apply(c, q, ok(now, "e"), probeAt, healthy, true, now)
		if ev != Released || got.Quarantine != nil || got.ReleasedMs != now || len(got.Window) != 0 || got.Strikes != 1 {
			t.Fatalf("event %d quarantine %+v releasedMs %d window %d strikes %d; want Released, none, now, empty, 1 (kept)",
				ev, got.Quarantine, got.ReleasedMs, len(got.Window), got.Strikes)
		}
		if q.Quarantine == nil || q.Strikes != 1 {
			t.Fatal("Apply modified its input")
		}
	})
	t.Run("canary failures requarantine with doubled backoff, capped", func(t *testing.T) {
		r := q
		now := probeAt
		for i, wantWait := range []time.Duration{2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute} {
			now = r.Quarantine.ProbeAtMs + 1_000
			got, ev, _ := Apply(c, r, fail(now, "e"), r.Quarantine.ProbeAtMs, healthy, true, now)
			if ev != Requarantined || got.Quarantine == nil || got.Strikes != int32(i+2) ||
				got.Quarantine.ProbeAtMs != now+wantWait.Milliseconds() || got.Quarantine.SinceMs != since || got.Quarantine.Reason != q.Quarantine.Reason {
				t.Fatalf("canary failure %d: event %d quarantine %+v strikes %d; want Requarantined, probe at now+%s, strikes %d, since/reason kept",
					i+1, ev, got.Quarantine, got.Strikes, wantWait, i+2)
			}
			if r.Quarantine.ProbeAtMs == got.Quarantine.ProbeAtMs {
				t.Fatal("Apply modified its input's quarantine")
			}
			r = got
		}
		// Then a canary succeeds: released, strikes kept.
		now = r.Quarantine.ProbeAtMs
		got, ev, _ := Apply(c, r, ok(now, "e"), now, healthy, true, now)
		if ev != Released || got.Strikes != 5 {
			t.Fatalf("release after 4 failed canaries: event %d strikes %d", ev, got.Strikes)
		}
	})
	t.Run("quarantined again soon after a release: strikes add up", func(t *testing.T) {
		rel, _, _ := Apply(c, q, ok(probeAt, "e"), probeAt, healthy, true, probeAt)
		again := rel.ReleasedMs + c.StrikeReset.Milliseconds() - 1
		r := observed(c, fail(again-2, "a"), fail(again-1, "b"))
		r.Strikes, r.ReleasedMs = rel.Strikes, rel.ReleasedMs
		got, ev, _ := Apply(c, r, fail(again, "c"), again, healthy, true, again)
		if ev != Quarantined || got.Strikes != 2 || got.Quarantine.ProbeAtMs != again+2*minute {
			t.Fatalf("event %d strikes %d quarantine %+v; want Quarantined, strikes 2, probe at now+2m", ev, got.Strikes, got.Quarantine)
		}
	})
	t.Run("quarantined again StrikeReset after a release: strikes reset", func(t *testing.T) {
		rel, _, _ := Apply(c, q, ok(probeAt, "e"), probeAt, healthy, true, probeAt)
		for _, after := range []int64{c.StrikeReset.Milliseconds(), 3 * c.StrikeReset.Milliseconds()} {
			again := rel.ReleasedMs + after
			r := observed(c, fail(again-2, "a"), fail(again-1, "b"))
			r.Strikes, r.ReleasedMs = 4, rel.ReleasedMs
			got, ev, _ := Apply(c, r, fail(again, "c"), again, healthy, true, again)
			if ev != Quarantined || got.Strikes != 1 || got.Quarantine.ProbeAtMs != again+minute {
				t.Fatalf("%s after the release: event %d strikes %d quarantine %+v; want Quarantined, strikes 1, probe at now+1m",
					time.Duration(after)*time.Millisecond, ev, got.Strikes, got.Quarantine)
			}
		}
	})
}

func TestRelease(t *testing.T) {
	r := Record{Window: []Outcome{fail(t0, "a")}, Strikes: 2, ReleasedMs: t0 - 5}
	if got, ok := r.Release(t0 + 1); ok || !reflect.DeepEqual(got, r) {
		t.Errorf("Release without a quarantine: %+v %v", got, ok)
	}
	q := quarantinedAt(def, t0)
	strikes := q.Strikes
	got, ok := q.Release(t0 + 1_000)
	if !ok || got.Quarantine != nil || got.ReleasedMs != t0+1_000 || len(got.Window) != 0 || got.Strikes != 0 || strikes == 0 {
		t.Errorf("Release: %+v %v; want no quarantine, releasedMs, empty window, strikes %d forgotten", got, ok, strikes)
	}
	if q.Quarantine == nil {
		t.Error("Release modified its receiver")
	}
}

// ---- guard, backoff, canary -----------------------------------------------------

func TestGuardAllows(t *testing.T) {
	cases := []struct {
		share             float64
		quarantined, live int
		want              bool
	}{
		{0.25, 0, 0, false},
		{0.25, 0, 1, false}, // never the last live node
		{1, 0, 1, false},
		{0.25, 0, 2, true}, // max(1, floor(0.5)) = 1
		{0.25, 1, 2, false},
		{0.25, 0, 3, true},
		{0.25, 1, 3, false},
		{0.25, 0, 4, true}, // floor(1) = 1
		{0.25, 1, 4, false},
		{0.25, 0, 10, true}, // floor(2.5) = 2
		{0.25, 1, 10, true},
		{0.25, 2, 10, false},
		{0.25, 7, 10, false},
		{0.5, 1, 4, true},
		{0.5, 2, 4, false},
		{1, 2, 4, true},
		{1, 3, 4, false}, // the last one
		{0, 0, 2, true},  // 0 takes the default 0.25
		{0, 1, 8, true},
		{0, 2, 8, false},
	}
	for _, c := range cases {
		if got := GuardAllows(Config{MaxShare: c.share}, c.quarantined, c.live); got != c.want {
			t.Errorf("share %g, %d of %d quarantined: GuardAllows = %v, want %v", c.share, c.quarantined, c.live, got, c.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	for _, c := range []struct {
		c       Config
		strikes int32
		want    time.Duration
	}{
		{def, 0, time.Minute},
		{def, 1, time.Minute},
		{def, 2, 2 * time.Minute},
		{def, 3, 4 * time.Minute},
		{def, 6, 32 * time.Minute},
		{def, 7, time.Hour}, // 64m capped at MaxProbeAfter
		{def, 100, time.Hour},
		{def, 1 << 30, time.Hour},
		{Config{ProbeAfter: 10 * time.Second, MaxProbeAfter: 25 * time.Second}, 2, 20 * time.Second},
		{Config{ProbeAfter: 10 * time.Second, MaxProbeAfter: 25 * time.Second}, 3, 25 * time.Second},
		{Config{ProbeAfter: 2 * time.Hour}, 3, 2 * time.Hour}, // MaxProbeAfter raised to ProbeAfter
	} {
		if got := Backoff(c.c, c.strikes); got != c.want {
			t.Errorf("Backoff(%s/%s, %d) = %s, want %s", c.c.ProbeAfter, c.c.MaxProbeAfter, c.strikes, got, c.want)
		}
	}
}

func TestCanaryDue(t *testing.T) {
	var none *Quarantine
	if none.CanaryDue(t0, 0) {
		t.Error("nil quarantine: canary due")
	}
	q := &Quarantine{SinceMs: t0, ProbeAtMs: t0 + minute}
	for _, c := range []struct {
		name           string
		now, lastAsgnd int64
		want           bool
	}{
		{"before the probe time", t0 + minute - 1, 0, false},
		{"at the probe time, nothing running", t0 + minute, 0, true},
		{"later, nothing running", t0 + 10*minute, 0, true},
		{"an attempt from before the probe time runs", t0 + minute, t0 + minute - 1, true},
		{"a canary runs", t0 + 2*minute, t0 + minute, false},
		{"a canary runs (assigned later)", t0 + 2*minute, t0 + minute + 5, false},
	} {
		if got := q.CanaryDue(c.now, c.lastAsgnd); got != c.want {
			t.Errorf("%s: CanaryDue = %v, want %v", c.name, got, c.want)
		}
	}
}

// ---- property -------------------------------------------------------------------

// TestPropertyApply drives one node's record through random outcomes of
// several jobs (with random region rates, guard answers and canary timing)
// and checks, after every step, the window's bounds, the quarantine state
// machine, Judge's agreement with Apply, and that failures of one job alone
// never quarantine the node.
func TestPropertyApply(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		c := Config{
			Window:        time.Duration(rapid.IntRange(1, 600).Draw(rt, "window_s")) * time.Second,
			MaxEntries:    rapid.IntRange(1, 40).Draw(rt, "max_entries"),
			Recent:        rapid.IntRange(1, 20).Draw(rt, "recent"),
			MinFailures:   rapid.IntRange(1, 5).Draw(rt, "min_failures"),
			MinJobs:       rapid.IntRange(2, 3).Draw(rt, "min_jobs"),
			MinRate:       float64(rapid.IntRange(1, 10).Draw(rt, "min_rate_tenths")) / 10,
			RateFactor:    float64(rapid.IntRange(1, 5).Draw(rt, "rate_factor")),
			ProbeAfter:    time.Duration(rapid.IntRange(1, 120).Draw(rt, "probe_after_s")) * time.Second,
			MaxProbeAfter: time.Duration(rapid.IntRange(1, 600).Draw(rt, "max_probe_after_s")) * time.Second,
			StrikeReset:   time.Duration(rapid.IntRange(1, 600).Draw(rt, "strike_reset_s")) * time.Second,
			Off:           rapid.IntRange(0, 9).Draw(rt, "off") == 0,
		}
		cfg := c.WithDefaults()
		// oneBad: only job "bad" ever fails (a bad job, a healthy node).
		oneBad := rapid.Bool().Draw(rt, "one_bad_job")
		jobs := []string{"bad", "j1", "j2", "j3"}

		var r Record
		clock := t0
		steps := rapid.IntRange(1, 150).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			clock += int64(rapid.IntRange(0, 120_000).Draw(rt, "dt"))
			job := rapid.SampledFrom(jobs).Draw(rt, "job")
			failed := rapid.IntRange(0, 2).Draw(rt, "failed") > 0
			if oneBad {
				failed = job == "bad"
			}
			o := Outcome{AtMs: clock, Job: job, Failed: failed}
			assigned := clock - int64(rapid.IntRange(0, 300_000).Draw(rt, "ran_ms"))
			restN := rapid.IntRange(0, 200).Draw(rt, "rest_attempts")
			rest := Stats{Attempts: restN, Failures: rapid.IntRange(0, restN).Draw(rt, "rest_failures")}
			guard := rapid.Bool().Draw(rt, "guard")

			prev := deepCopy(r)
			verdict := Judge(c, r, job, rest, guard, clock)
			next, ev, reason := Apply(c, r, o, assigned, rest, guard, clock)
			if !reflect.DeepEqual(r, prev) {
				rt.Fatalf("input modified:\n was %+v\n now %+v", prev, r)
			}

			// The window: at most MaxEntries, none older than Window.
			if len(next.Window) > cfg.MaxEntries {
				rt.Fatalf("window of %d > MaxEntries %d", len(next.Window), cfg.MaxEntries)
			}
			for _, w := range next.Window {
				if w.AtMs < clock-cfg.Window.Milliseconds() {
					rt.Fatalf("window holds an outcome %d ms old (Window %s)", clock-w.AtMs, cfg.Window)
				}
			}
			if s := next.Recent(c, clock); s.Attempts > cfg.Recent {
				rt.Fatalf("Recent over %d outcomes > %d", s.Attempts, cfg.Recent)
			}

			if oneBad && (ev == Quarantined || ev == Refused) {
				rt.Fatalf("failures of one job only: event %d (%s)", ev, reason)
			}
			if c.Off && (ev == Quarantined || ev == Refused || (verdict != NotBlamed && r.Quarantine == nil)) {
				rt.Fatalf("off: event %d verdict %d", ev, verdict)
			}
			if next.Strikes < 0 {
				rt.Fatalf("strikes %d", next.Strikes)
			}

			if pq := prev.Quarantine; pq != nil {
				canary := assigned >= pq.ProbeAtMs
				switch {
				case !canary:
					if ev != None || !reflect.DeepEqual(next.Quarantine, pq) || next.Strikes != prev.Strikes {
						rt.Fatalf("non-canary outcome: event %d quarantine %+v → %+v", ev, pq, next.Quarantine)
					}
				case !failed:
					if ev != Released || next.Quarantine != nil || len(next.Window) != 0 || next.ReleasedMs != clock || next.Strikes != prev.Strikes {
						rt.Fatalf("canary success: event %d %+v", ev, next)
					}
				default:
					if ev != Requarantined || next.Quarantine == nil || next.Strikes != prev.Strikes+1 ||
						next.Quarantine.ProbeAtMs != clock+Backoff(c, next.Strikes).Milliseconds() ||
						next.Quarantine.SinceMs != pq.SinceMs || next.Quarantine.Reason != pq.Reason {
						rt.Fatalf("canary failure: event %d strikes %d → %d quarantine %+v", ev, prev.Strikes, next.Strikes, next.Quarantine)
					}
				}
				if failed && !c.Off && verdict != Faulty {
					rt.Fatalf("failure on a quarantined node judged %d, want Faulty", verdict)
				}
			} else {
				out, why := Outlier(c, next.Recent(c, clock), rest)
				wantEv := None
				if failed && !c.Off && out {
					wantEv = Refused
					if guard {
						wantEv = Quarantined
					}
				}
				if ev != wantEv {
					rt.Fatalf("event %d, want %d (failed %v, outlier %v, guard %v)", ev, wantEv, failed, out, guard)
				}
				if (ev == Quarantined || ev == Refused) && reason != why {
					rt.Fatalf("reason %q, want Outlier's %q", reason, why)
				}
				if ev == Quarantined {
					wantStrikes := prev.Strikes + 1
					if prev.ReleasedMs > 0 && clock-prev.ReleasedMs >= cfg.StrikeReset.Milliseconds() {
						wantStrikes = 1
					}
					q := next.Quarantine
					if q == nil || q.SinceMs != clock || q.Reason != reason || next.Strikes != wantStrikes ||
						q.ProbeAtMs != clock+Backoff(c, next.Strikes).Milliseconds() {
						rt.Fatalf("quarantined: %+v strikes %d (was %d, released %d); want strikes %d", q, next.Strikes, prev.Strikes, prev.ReleasedMs, wantStrikes)
					}
					if s := next.Recent(c, clock); s.Failures < cfg.MinFailures || s.Jobs < cfg.MinJobs {
						rt.Fatalf("quarantined on %+v", s)
					}
				} else if next.Quarantine != nil || next.Strikes != prev.Strikes {
					rt.Fatalf("event %d changed the quarantine: %+v strikes %d → %d", ev, next.Quarantine, prev.Strikes, next.Strikes)
				}
				// Judge agrees with Apply on a failure: Faulty iff Apply
				// quarantines the node.
				if failed && !c.Off && (verdict == Faulty) != (ev == Quarantined) {
					rt.Fatalf("Judge %d but Apply's event %d", verdict, ev)
				}
			}
			r = next
		}
	})
}
