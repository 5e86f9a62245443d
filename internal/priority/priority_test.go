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
