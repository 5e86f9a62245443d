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
}

// OK reports whether the run kept every promise.
func (v Verdict) OK() bool {
	return len(v.Lost)+len(v.Duplicates)+len(v.StaleEffects)+len(v.Unrecorded)+len(v.SovereigntyViolations) == 0
}

// Error lists the violations with their ids.
func (v Verdict) Error() string {
	return fmt.Sprintf("lost %v, duplicates %v, stale effects %v, unrecorded %v, sovereignty violations %v",
		v.Lost, v.Duplicates, v.StaleEffects, v.Unrecorded, v.SovereigntyViolations)
}

// Verify checks jobs read back after a run (GetJobLogs tasks with their
// attempt results) against the ledger. accepted lists every job id the
// system accepted; jobs holds what could be read back (a missing one is
// lost); jurisdictionOf maps a region to its jurisdiction.
func Verify(accepted []string, jobs map[string]*apiaryv1.Job, ledger []Effect, jurisdictionOf map[string]string) Verdict {
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
			if committed != nil {
				ran := false
				for _, e := range effs {
					if e.Attempt == committed.GetAttempt() {
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
	for _, l := range [][]string{v.Lost, v.Duplicates, v.StaleEffects, v.Unrecorded, v.SovereigntyViolations} {
		sort.Strings(l)
	}
	return v
}
