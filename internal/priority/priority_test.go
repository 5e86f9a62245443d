package priority

import "testing"

func TestOfBoundaries(t *testing.T) {
	for p, want := range map[int32]string{0: Batch, 1: Batch, 39: Batch, 40: Standard, 50: Standard, 79: Standard, 80: Urgent, 100: Urgent} {
		if got := Of(p); got != want {
			t.Errorf("Of(%d) = %s, want %s", p, got, want)
		}
	}
	if len(Classes) != 3 || Classes[0] != Batch || Classes[2] != Urgent {
		t.Errorf("Classes = %v, want batch, standard, urgent in order (the WAN backlog tag encodes in this order)", Classes)
	}
}

func TestValueIsInItsClassAndPreemptsTheClassesBelow(t *testing.T) {
	prev := int32(-PreemptionDelta)
	for _, c := range Classes {
		v, ok := Value(c)
		if !ok || Of(v) != c {
			t.Errorf("Value(%s) = %d, %v: not in its own class", c, v, ok)
		}
		if v-prev < PreemptionDelta {
			t.Errorf("Value(%s) = %d is less than PreemptionDelta above the class below (%d)", c, v, prev)
		}
		prev = v
	}
	if _, ok := Value("critical"); ok {
		t.Error("Value accepted an unknown class")
	}
}
