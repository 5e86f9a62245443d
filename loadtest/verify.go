package loadtest

import (
	"fmt"
	"sort"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// Verdict is what the verifier found. A run is valid when every list is empty.
type Verdict struct {
	Accepted  int `json:"accepted"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	// Lost are accepted jobs that are not terminal (or could not be read).
	Lost []string `json:"lost"`
	// Duplicates are tasks ("job/index") with more than one committed
	// completion.
	Duplicates []string `json:"duplicates"`
	// StaleEffects are ledger effects of a non-committed attempt whose fencing
	// token is not lower than the committed one ("job/index@attempt").
	StaleEffects []string `json:"stale_effects"`
	// Unrecorded are completed tasks with no effect in the ledger.
	Unrecorded []string `json:"unrecorded"`
	// SovereigntyViolations are effects in a region outside the job's
	// allowed jurisdiction ("job/index@region").
	SovereigntyViolations []string `json:"sovereignty_violations"`
	// Incomplete are accepted jobs that ended FAILED or CANCELLED, with
	// Checks.AllComplete: "job (task i: its error)", or "job (STATE)".
	Incomplete []string `json:"incomplete,omitempty"`
	// DoubleEffects are tasks ("job/index") whose work completed more than
	// once (two done lines in the ledger), with Checks.EffectOnce.
	DoubleEffects []string `json:"double_effects,omitempty"`
	// StaleSurvivors are attempts ("job/index@attempt") that the region
	// replaced while their agent was cut off and that still finished their
	// work after the agent was back in contact, when it should have killed
	// them (partition-agent; see partitionFigures).
	StaleSurvivors []string `json:"stale_survivors,omitempty"`
	// ReexecutedEffects counts tasks whose work completed twice (two done
	// lines) with Checks.EffectOnce off: a replaced attempt that finished
	// while its agent was cut off, before the agent could learn that it was
	// replaced. Its fencing token is lower than the committed attempt's, so
	// a consumer can reject its effect; one with a token as high is also a
	// StaleEffect (a violation).
	ReexecutedEffects int `json:"reexecuted_effects"`
}

// Checks selects promises beyond the base ones (nothing lost, no duplicate
// committed completion, no stale effect with a token as high as the
// committed one's, no completion without an effect, no sovereignty
// violation), which Verify always checks.
type Checks struct {
	// AllComplete: every accepted job must end COMPLETE; FAILED or
	// CANCELLED is a violation (Incomplete).
	AllComplete bool
	// EffectOnce: no task's work may complete twice: at most one done line
	// per task in the ledger (DoubleEffects).
	EffectOnce bool
}

// OK reports whether the run kept every promise.
func (v Verdict) OK() bool {
	return len(v.Lost)+len(v.Duplicates)+len(v.StaleEffects)+len(v.Unrecorded)+len(v.SovereigntyViolations)+
		len(v.Incomplete)+len(v.DoubleEffects)+len(v.StaleSurvivors) == 0
}

// Error lists the violations with their ids.
func (v Verdict) Error() string {
	s := fmt.Sprintf("lost %v, duplicates %v, stale effects %v, unrecorded %v, sovereignty violations %v",
		v.Lost, v.Duplicates, v.StaleEffects, v.Unrecorded, v.SovereigntyViolations)
	if len(v.Incomplete)+len(v.DoubleEffects)+len(v.StaleSurvivors) > 0 {
		s += fmt.Sprintf(", incomplete %v, double effects %v, stale survivors %v", v.Incomplete, v.DoubleEffects, v.StaleSurvivors)
	}
	return s
}

// Verify checks jobs read back after a run (GetJobLogs tasks with their
// attempt results) against the ledger. accepted lists every job id the
// system accepted; jobs holds what could be read back (a missing one is
// lost); jurisdictionOf maps a region to its jurisdiction.
func Verify(accepted []string, jobs map[string]*apiaryv1.Job, ledger []Effect, jurisdictionOf map[string]string) Verdict {
	return VerifyWith(accepted, jobs, ledger, jurisdictionOf, Checks{})
}

// VerifyWith is Verify with the extra checks of c.
func VerifyWith(accepted []string, jobs map[string]*apiaryv1.Job, ledger []Effect, jurisdictionOf map[string]string, c Checks) Verdict {
	v := Verdict{Accepted: len(accepted)}
	effects := map[string][]Effect{}
	for _, e := range ledger {
		k := fmt.Sprintf("%s/%d", e.JobID, e.Task)
		effects[k] = append(effects[k], e)
	}
	for _, id := range accepted {
		j := jobs[id]
		if j == nil {
			v.Lost = append(v.Lost, id)
			continue
		}
		switch j.GetState() {
		case apiaryv1.JobState_JOB_STATE_COMPLETE:
			v.Completed++
		case apiaryv1.JobState_JOB_STATE_FAILED, apiaryv1.JobState_JOB_STATE_CANCELLED:
			v.Failed++
			if c.AllComplete {
				why := j.GetState().String()
				for _, t := range j.GetTasks() {
					if t.GetError() != "" {
						why = fmt.Sprintf("task %d: %s", t.GetIndex(), t.GetError())
						break
					}
				}
				v.Incomplete = append(v.Incomplete, id+" ("+why+")")
			}
		default:
			v.Lost = append(v.Lost, id)
		}
		allowed := j.GetSpec().GetJurisdiction()
		for _, t := range j.GetTasks() {
			k := fmt.Sprintf("%s/%d", id, t.GetIndex())
			var committed *apiaryv1.AttemptResult
			n := 0
			for _, a := range t.GetAttempts() {
				if a.GetOutcome() == "complete" {
					n++
					committed = a
				}
			}
			if n > 1 {
				v.Duplicates = append(v.Duplicates, k)
			}
			effs := effects[k]
			done := 0
			for _, e := range effs {
				if e.Done {
					done++
				}
			}
			if done > 1 {
				if c.EffectOnce {
					v.DoubleEffects = append(v.DoubleEffects, k)
				} else {
					v.ReexecutedEffects++
				}
			}
			if committed != nil {
				ran := false
				for _, e := range effs {
					// By token, not attempt number: a job that failed over
					// counts attempts from 1 again in its new region.
					if e.FencingToken == committed.GetFencingToken() {
						ran = true
						continue
					}
					if e.FencingToken >= committed.GetFencingToken() {
						v.StaleEffects = append(v.StaleEffects, fmt.Sprintf("%s@%d", k, e.Attempt))
					}
				}
				if !ran {
					v.Unrecorded = append(v.Unrecorded, k)
				}
			}
			if allowed != "" {
				for _, e := range effs {
					if jurisdictionOf[e.Region] != allowed {
						v.SovereigntyViolations = append(v.SovereigntyViolations, fmt.Sprintf("%s@%s", k, e.Region))
					}
				}
			}
		}
	}
	for _, l := range [][]string{v.Lost, v.Duplicates, v.StaleEffects, v.Unrecorded, v.SovereigntyViolations, v.Incomplete, v.DoubleEffects} {
		sort.Strings(l)
	}
	return v
}
