package loadtest

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLedgerTaskWritesWhatReadLedgerReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	env := map[string]string{"APIARY_JOB_ID": "eu-west-x", "APIARY_TASK_INDEX": "3", "APIARY_ATTEMPT": "2",
		"APIARY_FENCING_TOKEN": "281474976710699", "APIARY_NODE_ID": "n1", "APIARY_REGION": "eu-west"}
	for _, done := range []bool{false, true} {
		if err := LedgerTask(path, 0, done, func(k string) string { return env[k] }); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := ReadLedger(f)
	if err != nil {
		t.Fatal(err)
	}
	want := Effect{JobID: "eu-west-x", Task: 3, Attempt: 2, FencingToken: 281474976710699, Node: "n1", Region: "eu-west"}
	if len(got) != 3 || got[0] != want || got[1] != want || got[2] != (Effect{want.JobID, 3, 2, want.FencingToken, "n1", "eu-west", true}) {
		t.Errorf("ledger %+v; want start, start, done of %+v", got, want)
	}
}
