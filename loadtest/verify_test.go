package loadtest

import (
	"strings"
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

func job(id, jurisdiction string, state apiaryv1.JobState, tasks ...*apiaryv1.Task) *apiaryv1.Job {
	return &apiaryv1.Job{Id: id, State: state, Spec: &apiaryv1.JobSpec{Jurisdiction: jurisdiction}, Tasks: tasks}
}

func task(i int32, attempts ...*apiaryv1.AttemptResult) *apiaryv1.Task {
	return &apiaryv1.Task{Index: i, Attempts: attempts}
}

func res(attempt int32, token int64, outcome string) *apiaryv1.AttemptResult {
	return &apiaryv1.AttemptResult{Attempt: attempt, FencingToken: token, Outcome: outcome}
}

// clean is a run with a reclaimed first attempt that ran (stale effect with
// a lower token) and a committed second attempt.
func clean() ([]string, map[string]*apiaryv1.Job, []Effect, map[string]string) {
	jobs := map[string]*apiaryv1.Job{
		"eu-1": job("eu-1", "eu", apiaryv1.JobState_JOB_STATE_COMPLETE, task(0, res(1, 10, "lost"), res(2, 20, "complete"))),
		"eu-2": job("eu-2", "", apiaryv1.JobState_JOB_STATE_FAILED, task(0, res(1, 11, "failed"))),
	}
	ledger := []Effect{
		{JobID: "eu-1", Task: 0, Attempt: 1, FencingToken: 10, Node: "n1", Region: "eu-west"},
		{JobID: "eu-1", Task: 0, Attempt: 2, FencingToken: 20, Node: "n2", Region: "eu-west"},
		{JobID: "eu-2", Task: 0, Attempt: 1, FencingToken: 11, Node: "n2", Region: "us-east"},
	}
	return []string{"eu-1", "eu-2"}, jobs, ledger, map[string]string{"eu-west": "eu", "us-east": "us"}
}

func TestVerifyCleanRun(t *testing.T) {
	v := Verify(clean())
	if !v.OK() || v.Completed != 1 || v.Failed != 1 || v.Accepted != 2 {
		t.Fatalf("clean run judged %+v", v)
	}
}

func TestVerifyCatchesEachViolation(t *testing.T) {
	cases := map[string]struct {
		corrupt func(acc *[]string, jobs map[string]*apiaryv1.Job, ledger *[]Effect)
		check   func(Verdict) []string
		want    string
	}{
		"second committed completion": {
			corrupt: func(_ *[]string, jobs map[string]*apiaryv1.Job, _ *[]Effect) {
				t := jobs["eu-1"].Tasks[0]
				t.Attempts = append(t.Attempts, res(3, 30, "complete"))
			},
			check: func(v Verdict) []string { return v.Duplicates }, want: "eu-1/0",
		},
		"task run in the wrong jurisdiction": {
			corrupt: func(_ *[]string, _ map[string]*apiaryv1.Job, l *[]Effect) {
				*l = append(*l, Effect{JobID: "eu-1", Task: 0, Attempt: 1, FencingToken: 10, Node: "n9", Region: "us-east"})
			},
			check: func(v Verdict) []string { return v.SovereigntyViolations }, want: "eu-1/0@us-east",
		},
		"stale effect with a newer token": {
			corrupt: func(_ *[]string, _ map[string]*apiaryv1.Job, l *[]Effect) {
				(*l)[0].FencingToken = 25
			},
			check: func(v Verdict) []string { return v.StaleEffects }, want: "eu-1/0@1",
		},
		"accepted job missing": {
			corrupt: func(acc *[]string, _ map[string]*apiaryv1.Job, _ *[]Effect) {
				*acc = append(*acc, "eu-3")
			},
			check: func(v Verdict) []string { return v.Lost }, want: "eu-3",
		},
		"accepted job never finished": {
			corrupt: func(_ *[]string, jobs map[string]*apiaryv1.Job, _ *[]Effect) {
				jobs["eu-2"].State = apiaryv1.JobState_JOB_STATE_RUNNING
			},
			check: func(v Verdict) []string { return v.Lost }, want: "eu-2",
		},
		"completion with no effect in the ledger": {
			corrupt: func(_ *[]string, _ map[string]*apiaryv1.Job, l *[]Effect) {
				*l = (*l)[:1]
			},
			check: func(v Verdict) []string { return v.Unrecorded }, want: "eu-1/0",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			acc, jobs, ledger, jur := clean()
			tc.corrupt(&acc, jobs, &ledger)
			v := Verify(acc, jobs, ledger, jur)
			if v.OK() {
				t.Fatalf("verifier missed it: %+v", v)
			}
			if got := tc.check(v); len(got) != 1 || got[0] != tc.want {
				t.Fatalf("want exactly [%s], got %v (verdict %s)", tc.want, got, v.Error())
			}
		})
	}
}

func TestReadLedger(t *testing.T) {
	l, err := ReadLedger(strings.NewReader("j1,0,1,42,n1,eu-west\n\nj1,1,2,43,n2,eu-west\n"))
	if err != nil || len(l) != 2 || l[1].FencingToken != 43 || l[1].Attempt != 2 {
		t.Fatalf("%v %v", l, err)
	}
	if _, err := ReadLedger(strings.NewReader("j1,0,1,42,n1,eu-west\nbroken,line\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("malformed line: %v", err)
	}
	if _, err := ReadLedger(strings.NewReader("j1,x,1,42,n1,eu\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("bad number: %v", err)
	}
	l, err = ReadLedger(strings.NewReader("j1,0,1,42,n1,eu-west\nj1,0,1,42,n1,eu-west,done\nj1,0,2,43,n1,eu-west,start\n"))
	if err != nil || len(l) != 3 || l[0].Done || !l[1].Done || l[2].Done {
		t.Fatalf("done lines: %v %v", l, err)
	}
	if _, err := ReadLedger(strings.NewReader("j1,0,1,42,n1,eu-west,finished\n")); err == nil || !strings.Contains(err.Error(), "line 1: field 7") {
		t.Fatalf("bad phase: %v", err)
	}
}
