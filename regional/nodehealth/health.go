package nodehealth

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Outcome is one attempt that ended on the node: a success or a failure (a
// non-zero exit, a timeout, a start failure). Losses, drains, refusals and
// cancellations are not outcomes: they say nothing of the node's health.
type Outcome struct {
	// AtMs is when the attempt ended (Unix ms).
	AtMs int64 `json:"t"`
	// Job is the attempt's job id.
	Job    string `json:"j"`
	Failed bool   `json:"f,omitempty"`
}

// Record is a node's health (/apiary/nodes/<id>/health, JSON). It is
// updated in the Txn that commits the reports it counts, so it survives a
// coordinator's death and every shard's reports count in one place.
type Record struct {
	// Window holds the node's latest outcomes, oldest first: none older
	// than Config.Window, at most Config.MaxEntries.
	Window []Outcome `json:"window,omitempty"`
	// Quarantine is set while the node is quarantined automatically.
	Quarantine *Quarantine `json:"quarantine,omitempty"`
	// Strikes counts automatic quarantines in a row: failed canaries count,
	// and it restarts from 0 when the node is quarantined again more than
	// Config.StrikeReset after its last release.
	Strikes int32 `json:"strikes,omitempty"`
	// ReleasedMs is when the last automatic quarantine ended (Unix ms).
	ReleasedMs int64 `json:"released_ms,omitempty"`
}

// Quarantine is an automatic quarantine.
type Quarantine struct {
	SinceMs int64  `json:"since_ms"`
	Reason  string `json:"reason"`
	// ProbeAtMs: from then on the node may take one canary (the next task
	// that fits); an attempt assigned at or after it is the canary.
	ProbeAtMs int64 `json:"probe_at_ms"`
}

// Config is the attribution and quarantine policy of a region. Zero fields
// take DefaultConfig's values.
type Config struct {
	// Window is how far back outcomes count (default 10 min).
	Window time.Duration
	// MaxEntries bounds the outcomes kept per node (default 32).
	MaxEntries int
	// Recent is how many of the node's latest outcomes its failure rate is
	// taken over (default 10): a node that was healthy for hours and broke
	// a minute ago must stand out after a few failures, not after its
	// failures outnumber an hour of successes.
	Recent int
	// MinFailures (default 3) failures among the recent outcomes, of at
	// least MinJobs (default 2) distinct jobs: failures of one job alone
	// never make a node an outlier (a bad job fails everywhere).
	MinFailures, MinJobs int
	// MinRate (default 0.5) is the least failure rate of an outlier, and
	// RateFactor (default 3) how many times the rest of the region's rate
	// (over the whole window) it must reach: when everything fails, no node
	// stands out.
	MinRate, RateFactor float64
	// ProbeAfter (default 1 min) is the backoff before the first canary of
	// a quarantine; it doubles with each strike up to MaxProbeAfter
	// (default 1 h).
	ProbeAfter, MaxProbeAfter time.Duration
	// StrikeReset (default 1 h): a release that lasted this long forgets
	// the strikes.
	StrikeReset time.Duration
	// MaxShare (default 0.25) bounds the automatically quarantined share of
	// the region's live nodes (at least 1 node, and never the last one):
	// the guard against a cause that is not one node's.
	MaxShare float64
	// Off turns automatic quarantine off: outcomes are still counted and
	// shown, nothing is quarantined, and no failure is blamed on a node by
	// its record.
	Off bool
}

// DefaultConfig is the policy a region runs with unless told otherwise.
func DefaultConfig() Config {
	return Config{Window: 10 * time.Minute, MaxEntries: 32, Recent: 10, MinFailures: 3, MinJobs: 2,
		MinRate: 0.5, RateFactor: 3, ProbeAfter: time.Minute, MaxProbeAfter: time.Hour,
		StrikeReset: time.Hour, MaxShare: 0.25}
}

// WithDefaults fills c's zero fields from DefaultConfig.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.Window <= 0 {
		c.Window = d.Window
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = d.MaxEntries
	}
	if c.Recent <= 0 {
		c.Recent = d.Recent
	}
	c.Recent = min(c.Recent, c.MaxEntries)
	if c.MinFailures <= 0 {
		c.MinFailures = d.MinFailures
	}
	if c.MinJobs <= 0 {
		c.MinJobs = d.MinJobs
	}
	if c.MinRate <= 0 {
		c.MinRate = d.MinRate
	}
	if c.RateFactor <= 0 {
		c.RateFactor = d.RateFactor
	}
	if c.ProbeAfter <= 0 {
		c.ProbeAfter = d.ProbeAfter
	}
	if c.MaxProbeAfter <= 0 {
		c.MaxProbeAfter = d.MaxProbeAfter
	}
	c.MaxProbeAfter = max(c.MaxProbeAfter, c.ProbeAfter)
	if c.StrikeReset <= 0 {
		c.StrikeReset = d.StrikeReset
	}
	if c.MaxShare <= 0 {
		c.MaxShare = d.MaxShare
	}
	return c
}

// Validate reports the first field out of range, naming it and the rule
// (flag names, since a region's operator sets them).
func (c Config) Validate() error {
	switch {
	case c.Window < 0:
		return fmt.Errorf("--quarantine-window: must not be negative (got %s)", c.Window)
	case c.ProbeAfter < 0:
		return fmt.Errorf("--quarantine-probe-after: must not be negative (got %s)", c.ProbeAfter)
	case c.MaxProbeAfter < 0:
		return fmt.Errorf("--quarantine-max-probe-after: must not be negative (got %s)", c.MaxProbeAfter)
	case math.IsNaN(c.MaxShare) || c.MaxShare < 0 || c.MaxShare > 1:
		return fmt.Errorf("--quarantine-max-share: must be between 0 and 1 (got %g)", c.MaxShare)
	case c.ProbeAfter > 0 && c.MaxProbeAfter > 0 && c.MaxProbeAfter < c.ProbeAfter:
		return fmt.Errorf("--quarantine-max-probe-after: must be at least --quarantine-probe-after (%s), got %s", c.ProbeAfter, c.MaxProbeAfter)
	case c.Window > 0 && c.Window < time.Second:
		return fmt.Errorf("--quarantine-window: at least 1s (got %s)", c.Window)
	}
	return nil
}

// Stats sums outcomes.
type Stats struct {
	Attempts, Failures int
	// Jobs is the number of distinct jobs among the failures.
	Jobs int
	// FirstFailMs and LastFailMs bound the failures (Unix ms).
	FirstFailMs, LastFailMs int64
}

// Rate is Failures/Attempts (0 without attempts).
func (s Stats) Rate() float64 {
	if s.Attempts == 0 {
		return 0
	}
	return float64(s.Failures) / float64(s.Attempts)
}

func sum(outs []Outcome) Stats {
	var s Stats
	jobs := map[string]bool{}
	for _, o := range outs {
		s.Attempts++
		if !o.Failed {
			continue
		}
		s.Failures++
		jobs[o.Job] = true
		if s.FirstFailMs == 0 || o.AtMs < s.FirstFailMs {
			s.FirstFailMs = o.AtMs
		}
		s.LastFailMs = max(s.LastFailMs, o.AtMs)
	}
	s.Jobs = len(jobs)
	return s
}

// live is the part of the window that still counts at nowMs.
func (r Record) live(c Config, nowMs int64) []Outcome {
	from := nowMs - c.Window.Milliseconds()
	i := 0
	for i < len(r.Window) && r.Window[i].AtMs < from {
		i++
	}
	return r.Window[i:]
}

// Totals sums the node's outcomes over the whole window at nowMs (what the
// rest of the region's rate is made of).
func (r Record) Totals(c Config, nowMs int64) Stats {
	return sum(r.live(c.WithDefaults(), nowMs))
}

// Recent sums the node's last c.Recent outcomes within the window at nowMs
// (what the node's own rate is taken over).
func (r Record) Recent(c Config, nowMs int64) Stats {
	c = c.WithDefaults()
	outs := r.live(c, nowMs)
	if len(outs) > c.Recent {
		outs = outs[len(outs)-c.Recent:]
	}
	return sum(outs)
}

// Observe returns r with o appended and the window trimmed at nowMs. r is
// not modified.
func (r Record) Observe(c Config, o Outcome, nowMs int64) Record {
	c = c.WithDefaults()
	w := slices.Clone(r.live(c, nowMs))
	if n := len(w); n > 0 && o.AtMs < w[n-1].AtMs {
		// Kept in time order (a coordinator whose clock is behind the
		// last writer's): trimming takes the oldest from the front.
		o.AtMs = w[n-1].AtMs
	}
	w = append(w, o)
	if len(w) > c.MaxEntries {
		w = w[len(w)-c.MaxEntries:]
	}
	r.Window = w
	return r
}

// Outlier reports whether a node whose recent outcomes are node stands out
// from the rest of the region, whose outcomes over the window are rest, and
// why (for operators: "5 failures of 3 jobs in 60 s ...").
//
// The rule: at least MinFailures failures of at least MinJobs distinct jobs
// among the node's recent outcomes, a failure rate of at least MinRate, and
// at least RateFactor times the rest of the region's rate, taken as
// failures/(attempts+RestPrior).
func Outlier(c Config, node, rest Stats) (bool, string) {
	c = c.WithDefaults()
	if node.Failures < c.MinFailures || node.Jobs < c.MinJobs {
		return false, ""
	}
	// The rest's rate counts RestPrior successes more than it saw, so that
	// a handful of attempts elsewhere (one failure of one) cannot hide an
	// outlier.
	rate := node.Rate()
	smoothed := float64(rest.Failures) / float64(rest.Attempts+RestPrior)
	if rate < c.MinRate || rate < c.RateFactor*smoothed {
		return false, ""
	}
	span := time.Duration(node.LastFailMs-node.FirstFailMs) * time.Millisecond
	restSays := "the rest of the region has no outcomes yet"
	if rest.Attempts > 0 {
		restSays = fmt.Sprintf("the rest of the region failed %.0f%% of %d", 100*rest.Rate(), rest.Attempts)
	}
	return true, fmt.Sprintf("%d failures of %d jobs in %s (%d of its last %d attempts; %s)",
		node.Failures, node.Jobs, roundSpan(span), node.Failures, node.Attempts, restSays)
}

// RestPrior is how many successes the rest of the region's rate is
// assumed to hold besides what it saw (Outlier).
const RestPrior = 10

func roundSpan(d time.Duration) string {
	if d < time.Second {
		return "under 1s"
	}
	return d.Round(time.Second).String()
}

// Backoff is the wait before the canary of a quarantine with the given
// strikes (>= 1): ProbeAfter × 2^(strikes-1), at most MaxProbeAfter.
func Backoff(c Config, strikes int32) time.Duration {
	c = c.WithDefaults()
	d := c.ProbeAfter
	for i := int32(1); i < strikes && d < c.MaxProbeAfter; i++ {
		d *= 2
	}
	return min(d, c.MaxProbeAfter)
}

// GuardAllows reports whether one more node may be quarantined
// automatically while quarantined of the region's live nodes already are:
// at most max(1, ⌊MaxShare × live⌋) at once, and never the last live node
// that is not quarantined.
func GuardAllows(c Config, quarantined, live int) bool {
	c = c.WithDefaults()
	// The epsilon keeps 0.29 x 100 at 29 (binary floating point makes it
	// 28.999...).
	limit := max(1, int(math.Floor(c.MaxShare*float64(live)+1e-9)))
	return quarantined+1 <= limit && live-(quarantined+1) >= 1
}

// Verdict is what the region holds against a node when one of its attempts
// fails, before the failure is applied.
type Verdict int

const (
	// NotBlamed: nothing the region knows puts the failure on the node; the
	// job's rules decide (package regional still confirms a failure that
	// would be final on a second node: a host that just broke has no
	// record yet, and no recent success proves it still works).
	NotBlamed Verdict = iota
	// Faulty: the node is quarantined (or this failure makes it an
	// outlier): the failure is the node's, not the task's.
	Faulty
)

// Judge is the verdict on a failure of job's attempt on the node: Faulty
// when it is quarantined or when this failure makes it an outlier (rest as
// in Outlier) that the guard allows to quarantine, else NotBlamed. With
// c.Off it is Faulty for a node still quarantined from before (whose canary
// Apply still decides) and NotBlamed otherwise.
func Judge(c Config, r Record, job string, rest Stats, guardAllows bool, nowMs int64) Verdict {
	c = c.WithDefaults()
	if r.Quarantine != nil {
		return Faulty
	}
	if c.Off {
		return NotBlamed
	}
	next := r.Observe(c, Outcome{AtMs: nowMs, Job: job, Failed: true}, nowMs)
	if out, _ := Outlier(c, next.Recent(c, nowMs), rest); out && guardAllows {
		return Faulty
	}
	return NotBlamed
}

// Event is what Apply did to the quarantine.
type Event int

const (
	None Event = iota
	// Quarantined: the node became an outlier and is quarantined.
	Quarantined
	// Refused: the node is an outlier but the share guard refused.
	Refused
	// Released: the canary succeeded.
	Released
	// Requarantined: the canary failed; the next one waits longer.
	Requarantined
)

// Apply counts an ended attempt's outcome o on the node and moves its
// quarantine: an outlier is quarantined (when guardAllows; else Refused)
// with the first canary due after Backoff; a canary (an attempt assigned
// at or after ProbeAtMs) that succeeded releases the node and clears its
// window, one that failed adds a strike and pushes the next canary out.
// rest is the rest of the region's window (Outlier). It returns the new
// record (r is not modified), the event and, for Quarantined and Refused,
// the rule's reason.
func Apply(c Config, r Record, o Outcome, assignedMs int64, rest Stats, guardAllows bool, nowMs int64) (Record, Event, string) {
	c = c.WithDefaults()
	r = r.Observe(c, o, nowMs)
	if q := r.Quarantine; q != nil {
		if assignedMs < q.ProbeAtMs {
			return r, None, ""
		}
		if !o.Failed {
			r.Quarantine, r.ReleasedMs, r.Window = nil, nowMs, nil
			return r, Released, ""
		}
		r.Strikes++
		nq := *q
		nq.ProbeAtMs = nowMs + Backoff(c, r.Strikes).Milliseconds()
		r.Quarantine = &nq
		return r, Requarantined, ""
	}
	if c.Off || !o.Failed {
		return r, None, ""
	}
	out, reason := Outlier(c, r.Recent(c, nowMs), rest)
	if !out {
		return r, None, ""
	}
	if !guardAllows {
		return r, Refused, reason
	}
	if r.ReleasedMs > 0 && nowMs-r.ReleasedMs >= c.StrikeReset.Milliseconds() {
		r.Strikes = 0
	}
	r.Strikes++
	r.Quarantine = &Quarantine{SinceMs: nowMs, Reason: reason, ProbeAtMs: nowMs + Backoff(c, r.Strikes).Milliseconds()}
	return r, Quarantined, reason
}

// Release ends an automatic quarantine by an operator's hand: the window is
// cleared and the strikes are forgotten (the operator vouches for the node;
// a canary's release keeps them, so that a flapping node waits longer each
// time). It returns false when there was none.
func (r Record) Release(nowMs int64) (Record, bool) {
	if r.Quarantine == nil {
		return r, false
	}
	r.Quarantine, r.ReleasedMs, r.Window, r.Strikes = nil, nowMs, nil, 0
	return r, true
}

// CanaryDue reports whether a quarantined node may take a canary at nowMs,
// given the latest assignment time of its active attempts (0 if none): the
// backoff has passed and no canary runs yet.
func (q *Quarantine) CanaryDue(nowMs, latestActiveAssignedMs int64) bool {
	return q != nil && nowMs >= q.ProbeAtMs && latestActiveAssignedMs < q.ProbeAtMs
}
