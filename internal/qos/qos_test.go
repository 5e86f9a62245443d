package qos

import (
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

func TestOf(t *testing.T) {
	lim := func(cpu, mem int64) *apiaryv1.ResourceLimits {
		return &apiaryv1.ResourceLimits{CpuMillis: cpu, MemoryMb: mem}
	}
	for _, c := range []struct {
		name string
		r    *apiaryv1.Resources
		want Class
	}{
		{"nil", nil, Burstable},
		{"requests only", &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 64}, Burstable},
		{"limits equal", &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 64, Limits: lim(100, 64)}, Guaranteed},
		{"memory limit only", &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 64, Limits: lim(0, 64)}, Burstable},
		{"cpu limit above", &apiaryv1.Resources{CpuMillis: 100, MemoryMb: 64, Limits: lim(200, 64)}, Burstable},
		{"best effort", &apiaryv1.Resources{BestEffort: true}, BestEffort},
	} {
		if got := Of(c.r); got != c.want {
			t.Errorf("%s: Of = %s, want %s", c.name, got, c.want)
		}
	}
	for i, c := range Classes {
		if Rank(c) != i {
			t.Errorf("Rank(%s) = %d, want %d (Classes is in preemption order)", c, Rank(c), i)
		}
	}
}
