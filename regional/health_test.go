package regional

import (
	"testing"
	"time"

	"apiary.dev/apiary/regional/nodehealth"
)

// outcomes is a health record of ok successes and failed failures, at nowMs.
func outcomes(nowMs int64, ok, failed int) nodehealth.Record {
	var r nodehealth.Record
	for i := range ok + failed {
		r.Window = append(r.Window, nodehealth.Outcome{AtMs: nowMs - int64(i), Job: "j", Failed: i >= ok})
	}
	return r
}

// TestRegionHealthSum: the rest of the region a report's node is judged
// against is the sum over the other ready, unheld, unquarantined nodes;
// the batch's own records replace the coordinator's; a change in the batch
// (renote) and a committed record (noteHealth) move the sums; a replaced
// node set (the capacity refresh) is summed anew.
func TestRegionHealthSum(t *testing.T) {
	now := time.Now().UnixMilli()
	c := &Coordinator{}
	st := &c.capState
	st.live = 4
	st.ready = map[string]bool{"a": true, "b": true, "c": true, "q": true, "h": true}
	st.eligible = map[string]bool{"a": true, "b": false, "c": true, "q": true, "h": true}
	st.held = map[string]bool{"h": true}
	quarantined := outcomes(now, 0, 50)
	quarantined.Quarantine = &nodehealth.Quarantine{}
	st.health = map[string]nodehealth.Record{"a": outcomes(now, 10, 0), "b": outcomes(now, 4, 2),
		"c": outcomes(now, 7, 1), "q": quarantined, "h": outcomes(now, 0, 40), "gone": outcomes(now, 0, 30)}

	h := newHealthState()
	h.reporting = map[string]bool{"a": true, "b": true}
	rest, live, other := c.restOf(h, "a", now)
	if rest.Attempts != 14 || rest.Failures != 3 || live != 4 || !other {
		t.Fatalf("rest of a: %+v live %d other %v; want b and c (14 attempts, 3 failures), live 4, another taker", rest, live, other)
	}
	// b's record as read with the batch replaces the coordinator's.
	h2 := newHealthState()
	h2.reporting = map[string]bool{"a": true, "b": true}
	h2.node("b").rec = outcomes(now, 1, 9)
	if rest, _, _ := c.restOf(h2, "a", now); rest.Attempts != 18 || rest.Failures != 10 {
		t.Fatalf("rest of a with b's batch record: %+v, want 18 attempts, 10 failures", rest)
	}
	// An outcome observed in the batch (renote) moves the batch's sum.
	h2.node("b").rec = outcomes(now, 1, 10)
	c.renote(h2, "b", h2.node("b").rec, now)
	if rest, _, _ := c.restOf(h2, "a", now); rest.Attempts != 19 || rest.Failures != 11 {
		t.Fatalf("rest of a after b's outcome: %+v, want 19 attempts, 11 failures", rest)
	}
	if rest, _, other := c.restOf(h2, "c", now); rest.Attempts != 21 || rest.Failures != 10 || !other {
		t.Fatalf("rest of c: %+v other %v, want a and b (21 attempts, 10 failures) and another taker", rest, other)
	}
	// A committed record moves the coordinator's sum for the next batch.
	h2.node("b").changed = true
	c.noteHealth(h2)
	h3 := newHealthState()
	if rest, _, _ := c.restOf(h3, "a", now); rest.Attempts != 19 || rest.Failures != 11 {
		t.Fatalf("next batch, rest of a: %+v, want 19 attempts, 11 failures", rest)
	}
	// A node set replaced by the capacity refresh is summed anew: c is gone.
	st.mu.Lock()
	st.ready = map[string]bool{"a": true, "b": true}
	st.region = nil
	st.mu.Unlock()
	h4 := newHealthState()
	if rest, _, other := c.restOf(h4, "b", now); rest.Attempts != 10 || rest.Failures != 0 || !other {
		t.Fatalf("rest of b after c left: %+v other %v, want a's 10 successes and a taker", rest, other)
	}
	if _, _, other := c.restOf(h4, "a", now); other {
		t.Fatal("rest of a: another taker, want none (b takes no placements)")
	}
}
