package agent

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestLedgerRefusesOverCapacity(t *testing.T) {
	l := NewLedger(Resources{CPUMillis: 2000, MemoryMB: 1024}, "", 0)
	k := func(i int32) AttemptKey { return AttemptKey{JobID: "j", TaskIndex: i, Attempt: 1} }
	if err := l.Reserve(k(0), Request{CPUMillis: 1500, MemoryMB: 512}); err != nil {
		t.Fatal(err)
	}
	err := l.Reserve(k(1), Request{CPUMillis: 1000, MemoryMB: 10})
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "cpu") {
		t.Fatalf("err %v, want no room: cpu", err)
	}
	err = l.Reserve(k(1), Request{CPUMillis: 500, MemoryMB: 513})
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("err %v, want no room: memory", err)
	}
	if err := l.Reserve(k(1), Request{CPUMillis: 500, MemoryMB: 512}); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(k(1), Request{}); !errors.Is(err, ErrHeld) {
		t.Fatalf("err %v, want ErrHeld", err)
	}
	if !l.Release(k(0)) || l.Release(k(0)) {
		t.Fatal("release")
	}
	if used, n := l.Used(); used.CPUMillis != 500 || used.MemoryMB != 512 || n != 1 {
		t.Fatalf("used %+v %d", used, n)
	}
	if err := l.Reserve(k(2), Request{CPUMillis: 1500}); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(k(3), Request{CPUMillis: -1}); err == nil || errors.Is(err, ErrNoRoom) {
		t.Fatalf("negative request: %v", err)
	}
}

func TestLedgerMaxTasks(t *testing.T) {
	l := NewLedger(Resources{CPUMillis: 1000, MemoryMB: 1000}, "", 2)
	for i := int32(0); i < 2; i++ {
		if err := l.Reserve(AttemptKey{"j", i, 1}, Request{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Reserve(AttemptKey{"j", 2, 1}, Request{}); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("err %v, want no room (max tasks)", err)
	}
	l.Release(AttemptKey{"j", 0, 1})
	if err := l.Reserve(AttemptKey{"j", 2, 1}, Request{}); err != nil {
		t.Fatal(err)
	}
}

func TestLedgerGPUs(t *testing.T) {
	l := NewLedger(Resources{CPUMillis: 8000, MemoryMB: 8000, GPUs: 2}, "a100", 0)
	// Two shares of 600 cannot share one device; a third share fits next to one.
	if err := l.Reserve(AttemptKey{"j", 0, 1}, Request{GPUMilli: 600}); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(AttemptKey{"j", 1, 1}, Request{GPUMilli: 600}); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(AttemptKey{"j", 2, 1}, Request{GPUMilli: 600}); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("err %v", err)
	}
	if err := l.Reserve(AttemptKey{"j", 3, 1}, Request{GPUMilli: 400}); err != nil {
		t.Fatal(err)
	}
	// No idle device for a whole GPU now.
	if err := l.Reserve(AttemptKey{"j", 4, 1}, Request{GPUs: 1}); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("err %v", err)
	}
	l.Release(AttemptKey{"j", 1, 1})
	if err := l.Reserve(AttemptKey{"j", 4, 1}, Request{GPUs: 1, GPUModels: []string{"h100"}}); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("wrong model: err %v", err)
	}
	if err := l.Reserve(AttemptKey{"j", 4, 1}, Request{GPUs: 1, GPUModels: []string{"h100", "a100"}}); err != nil {
		t.Fatal(err)
	}
}

func TestParseMemTotal(t *testing.T) {
	mb, err := parseMemTotal(strings.NewReader("MemTotal:       16303468 kB\nMemFree: 1 kB\n"))
	if err != nil || mb != 15921 {
		t.Fatalf("%d %v", mb, err)
	}
	if _, err := parseMemTotal(strings.NewReader("MemFree: 1 kB\n")); err == nil {
		t.Fatal("want error")
	}
}

// TestLedgerNamedDevices: an assignment that names its GPU devices gets
// exactly those, or is refused naming the device; without names the ledger
// picks as before.
func TestLedgerNamedDevices(t *testing.T) {
	l := NewLedger(Resources{CPUMillis: 8000, MemoryMB: 8192, GPUs: 4}, "t4", 0)
	key := func(i int32) AttemptKey { return AttemptKey{JobID: "j", TaskIndex: i, Attempt: 1} }
	if err := l.Reserve(key(0), Request{GPUs: 2, Devices: []int{3, 1}}); err != nil {
		t.Fatal(err)
	}
	if got := l.Devices(key(0)); !slices.Equal(got, []int{3, 1}) {
		t.Fatalf("devices %v, want [3 1]", got)
	}
	if err := l.Reserve(key(1), Request{GPUMilli: 400, Devices: []int{2}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		req  Request
		want string
	}{
		{Request{GPUs: 1, Devices: []int{1}}, "gpu device 1: not idle"},
		{Request{GPUs: 1, Devices: []int{2}}, "gpu device 2: not idle"},
		{Request{GPUMilli: 700, Devices: []int{2}}, "gpu device 2: 600/1000 free, need 700"},
		{Request{GPUs: 1, Devices: []int{4}}, "gpu device 4: not a device of this node (0..3)"},
		{Request{GPUs: 2, Devices: []int{0, 0}}, "gpu device 0 named twice"},
		{Request{GPUs: 2, Devices: []int{0}}, "gpu devices [0]: want 2"},
	} {
		err := l.Reserve(key(9), c.req)
		if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("Reserve(%+v) = %v, want ErrNoRoom with %q", c.req, err, c.want)
		}
	}
	// A share that fits the named device; then the ledger's own pick for an
	// unnamed whole GPU is the one idle device left.
	if err := l.Reserve(key(2), Request{GPUMilli: 600, Devices: []int{2}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Reserve(key(3), Request{GPUs: 1}); err != nil {
		t.Fatal(err)
	}
	if got := l.Devices(key(3)); !slices.Equal(got, []int{0}) {
		t.Fatalf("unnamed whole GPU got %v, want [0]", got)
	}
	l.Release(key(0))
	if err := l.Reserve(key(4), Request{GPUs: 2, Devices: []int{1, 3}}); err != nil {
		t.Fatalf("devices freed by Release: %v", err)
	}
}
