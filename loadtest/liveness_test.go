package loadtest

import (
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// TestLivenessOptionDefaults: the liveness scenarios fill defaults that
// make the tasks span the fault, and filling them twice changes nothing.
func TestLivenessOptionDefaults(t *testing.T) {
	p := Options{Scenario: PartitionAgent, Trials: 3}
	if err := p.Defaults(); err != nil {
		t.Fatal(err)
	}
	if p.Partition != 3*time.Second || p.TaskSleep != 8*time.Second || p.TrialEvery != 12*time.Second ||
		p.FirstFault != 11*time.Second || p.Rate != 4 || p.NodeLeaseTTL != time.Second || p.DrainTimeout < p.TaskSleep+30*time.Second {
		t.Fatalf("partition-agent defaults: %+v", p)
	}
	o := Options{Scenario: OutageRegion, Trials: 2}
	if err := o.Defaults(); err != nil {
		t.Fatal(err)
	}
	if o.Outage != 20*time.Second || o.TaskSleep != 30*time.Second || o.TrialEvery != 60*time.Second ||
		o.FirstFault != 32*time.Second || o.Coordinators != 3 || o.Slots != 64 || o.Rate != 3 ||
		o.SubmitTimeout != 50*time.Second || o.Duration != 32*time.Second+60*time.Second+30*time.Second {
		t.Fatalf("outage-region defaults: %+v", o)
	}
	again := o
	if err := again.Defaults(); err != nil || again.Duration != o.Duration || again.TaskSleep != o.TaskSleep || again.DrainTimeout != o.DrainTimeout {
		t.Fatalf("defaults not idempotent: %v %+v", err, again)
	}
	// Agent faults wait out the region's failover grace; scheduler faults
	// keep their schedule (a third of a trial in, TrialEvery per trial).
	k := Options{Scenario: KillAgent, Trials: 1, Rate: 5}
	if err := k.Defaults(); err != nil || k.TaskSleep != 300*time.Millisecond || k.FirstFault != 11*time.Second ||
		k.Duration != 15*time.Second || k.SubmitTimeout != 10*time.Second {
		t.Fatalf("kill-agent defaults: %v %+v", err, k)
	}
	ks := Options{Scenario: KillScheduler, Trials: 3, Rate: 5}
	if err := ks.Defaults(); err != nil || ks.FirstFault != 2*time.Second || ks.Duration != 18*time.Second {
		t.Fatalf("kill-scheduler defaults changed: %v %+v", err, ks)
	}
}

// TestLivenessOptionErrors: each rule that keeps the figures meaningful is
// enforced, and the error names the option.
func TestLivenessOptionErrors(t *testing.T) {
	cases := map[string]struct {
		o    Options
		want string
	}{
		"partition not longer than the lease":   {Options{Scenario: PartitionAgent, Trials: 1, Partition: time.Second}, "partition: must be longer than the node lease"},
		"tasks shorter than the partition":      {Options{Scenario: PartitionAgent, Trials: 1, Partition: 3 * time.Second, TaskSleep: 2 * time.Second}, "task-sleep: must be longer than the partition"},
		"partition trials too close":            {Options{Scenario: PartitionAgent, Trials: 1, TrialEvery: 4 * time.Second}, "trial-every: must be at least the partition + 5s"},
		"outage too short":                      {Options{Scenario: OutageRegion, Trials: 1, Outage: 500 * time.Millisecond}, "outage: must be in 1s..10m"},
		"outage too long":                       {Options{Scenario: OutageRegion, Trials: 1, Outage: time.Hour}, "outage: must be in 1s..10m"},
		"tasks shorter than the outage":         {Options{Scenario: OutageRegion, Trials: 1, Outage: 20 * time.Second, TaskSleep: 20 * time.Second}, "task-sleep: must be longer than the outage"},
		"outage trials overlap":                 {Options{Scenario: OutageRegion, Trials: 1, TrialEvery: 40 * time.Second}, "trial-every: must be at least outage + task-sleep"},
		"tasks do not fit the slots":            {Options{Scenario: OutageRegion, Trials: 1, Rate: 20}, "rate: rate x task-sleep (600 tasks at once) must fit the agents' slots (3 x 64)"},
		"cut agent's tasks do not fit the rest": {Options{Scenario: PartitionAgent, Trials: 1, Rate: 9}, "rate: rate x task-sleep (72 tasks at once) must fit the slots of the agents left when one is cut off (2 x 32)"},
		"partition with one agent":              {Options{Scenario: PartitionAgent, Trials: 1, Agents: 1}, "agents: partition-agent needs at least 2"},
		"no trials":                             {Options{Scenario: PartitionAgent}, "trials: must be in 1..200"},
		"not against an existing region":        {Options{Scenario: OutageRegion, Trials: 1, Addr: "127.0.0.1:1"}, "scenario: faults need a cluster"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.o.Defaults()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got %v", tc.want, err)
			}
		})
	}
}

func att(attempt int32, node string, epoch int64, outcome string, startMs, endMs int64) *apiaryv1.AttemptResult {
	return &apiaryv1.AttemptResult{Attempt: attempt, NodeId: node, NodeEpoch: epoch, FencingToken: int64(attempt) * 10,
		Outcome: outcome, StartTimeMs: startMs, EndTimeMs: endMs}
}

// TestVerifyLivenessChecks: AllComplete turns a FAILED job into a
// violation; EffectOnce turns a second done line into one, and without it
// the second done line is only counted.
func TestVerifyLivenessChecks(t *testing.T) {
	acc, jobs, ledger, jur := clean()
	ledger = append(ledger,
		Effect{JobID: "eu-1", Task: 0, Attempt: 1, FencingToken: 10, Node: "n1", Region: "eu-west", Done: true},
		Effect{JobID: "eu-1", Task: 0, Attempt: 2, FencingToken: 20, Node: "n2", Region: "eu-west", Done: true})
	if v := VerifyWith(acc, jobs, ledger, jur, Checks{}); !v.OK() || v.ReexecutedEffects != 1 {
		t.Fatalf("base checks: want OK with 1 re-executed effect, got %+v", v)
	}
	v := VerifyWith(acc, jobs, ledger, jur, Checks{AllComplete: true, EffectOnce: true})
	if v.OK() || len(v.Incomplete) != 1 || v.Incomplete[0] != "eu-2 (JOB_STATE_FAILED)" || len(v.DoubleEffects) != 1 || v.DoubleEffects[0] != "eu-1/0" {
		t.Fatalf("liveness checks: want incomplete [eu-2] and double effects [eu-1/0], got %+v", v)
	}
	if !strings.Contains(v.Error(), "double effects [eu-1/0]") {
		t.Fatalf("error text: %s", v.Error())
	}
}

// TestOutageFigures: on a hand-made outage from t=100 s to t=120 s
// (region back), next trial at t=200 s: a task that ended during it is a
// held report whose flush is when its job was seen terminal after the
// region was back; a task that ran through it spans it; a task whose
// running attempt was lost and run again is killed (while running) and
// charged; so is one placed after the region was back and lost then; a
// loss before the kill or after the next trial's kill is not this trial's;
// a job PENDING at the kill is neither held nor spanning.
func TestOutageFigures(t *testing.T) {
	const kill, back, next = 100_000, 120_000, 200_000
	done := apiaryv1.JobState_JOB_STATE_COMPLETE
	rerun := func(id string, lostStart, lostEnd int64) *apiaryv1.Job {
		return job(id, "", done, &apiaryv1.Task{Index: 0, Attempt: 2, NodeFailures: 1, Attempts: []*apiaryv1.AttemptResult{
			att(1, "n1", 5, "lost", lostStart, lostEnd), att(2, "n2", 6, "complete", lostEnd+1_000, lostEnd+31_000)}})
	}
	jobs := map[string]*apiaryv1.Job{
		"held":   job("held", "", done, task(0, att(1, "n1", 5, "complete", 80_000, 110_000))),
		"held2":  job("held2", "", done, task(0, att(1, "n2", 6, "complete", 85_000, 119_000))),
		"span":   job("span", "", done, task(0, att(1, "n1", 5, "complete", 95_000, 125_000))),
		"lost":   rerun("lost", 90_000, 130_000),
		"burst":  rerun("burst", 121_000, 125_000),
		"before": rerun("before", 60_000, 95_000),
		"after":  rerun("after", 190_000, 210_000),
		"late":   job("late", "", done, task(0, att(1, "n2", 6, "complete", 121_000, 151_000))),
	}
	terminalAt := map[string]time.Time{
		"held":  time.UnixMilli(back + 1_500),
		"held2": time.UnixMilli(back + 4_200),
		"span":  time.UnixMilli(125_100),
	}
	var tl TrialLiveness
	note := outageFigures(&tl, jobs, []string{"held", "held2", "span", "lost", "late"}, terminalAt, kill, back, next)
	if note != "" {
		t.Fatalf("note %q", note)
	}
	if tl.HeldReports != 2 || tl.SpanningTasks != 1 || tl.FlushMs != 4_200 || tl.SlowestHeld != "held2" ||
		tl.TasksKilled != 2 || tl.KilledRunning != 1 || tl.AttemptsCharged != 2 {
		t.Fatalf("figures: %+v", tl)
	}
	// The last trial's window has no end.
	var open TrialLiveness
	outageFigures(&open, jobs, nil, terminalAt, kill, back, 0)
	if open.TasksKilled != 3 {
		t.Fatalf("open window: %+v", open)
	}
	// A held job never seen terminal, and a trial with nothing held.
	delete(terminalAt, "held2")
	var tl2 TrialLiveness
	if note := outageFigures(&tl2, jobs, []string{"held2"}, terminalAt, kill, back, next); !strings.Contains(note, "held job held2 not seen terminal") ||
		!strings.Contains(note, "no task ran through the outage") {
		t.Fatalf("note %q", note)
	}
	var tl3 TrialLiveness
	if note := outageFigures(&tl3, jobs, []string{"span"}, terminalAt, kill, back, next); !strings.Contains(note, "no report was held") {
		t.Fatalf("note %q", note)
	}
}

// TestPartitionFigures: node n1 cut at t=100 s on epoch 5, healed at
// t=103 s, tasks of 8 s. A replaced attempt that finished during the cut
// is a re-executed effect; one that finished its work although it should
// have run until after heal + staleKillBound is a stale survivor; one that
// was killed in time is neither; an attempt started before the cut and
// completed on epoch 9 is adopted.
func TestPartitionFigures(t *testing.T) {
	const cut, heal = 100_000, 103_000
	done := apiaryv1.JobState_JOB_STATE_COMPLETE
	jobs := map[string]*apiaryv1.Job{
		"reexec": job("reexec", "", done, task(0, att(1, "n1", 5, "lost", 93_000, 101_500), att(2, "n2", 3, "complete", 102_000, 110_000))),
		"killed": job("killed", "", done, task(0, att(1, "n1", 5, "lost", 99_000, 101_500), att(2, "n2", 3, "complete", 102_000, 110_000))),
		"surv":   job("surv", "", done, task(0, att(1, "n1", 5, "lost", 99_500, 101_500), att(2, "n3", 4, "complete", 102_000, 110_000))),
		"adopt":  job("adopt", "", done, task(0, att(1, "n1", 9, "complete", 98_000, 106_000))),
		"other":  job("other", "", done, task(0, att(1, "n2", 3, "complete", 98_000, 106_000))),
	}
	ix := indexLedger([]Effect{
		{JobID: "reexec", Task: 0, Attempt: 1}, {JobID: "reexec", Task: 0, Attempt: 1, Done: true},
		{JobID: "killed", Task: 0, Attempt: 1},
		{JobID: "surv", Task: 0, Attempt: 1}, {JobID: "surv", Task: 0, Attempt: 1, Done: true},
	})
	var tl TrialLiveness
	partitionFigures(&tl, jobs, ix, "n1", 5, cut, heal, 8*time.Second)
	if tl.Replaced != 3 || tl.Adopted != 1 || tl.ReexecutedEffects != 2 || len(tl.StaleSurvivors) != 1 || tl.StaleSurvivors[0] != "surv/0@1" {
		t.Fatalf("figures: %+v", tl)
	}
}
