package loadtest

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestFleetOptionsDefaults(t *testing.T) {
	ok := func() FleetOptions {
		return FleetOptions{Agents: 1001, Addrs: []string{" 127.0.0.1:1 ", ""}, CPUMillis: 1000, MemoryMB: 1024, DataDir: t.TempDir()}
	}
	o := ok()
	if err := o.Defaults(); err != nil {
		t.Fatal(err)
	}
	if o.NodePrefix != "sim" || o.StartRate != 200 || o.ConnsPerAddr != 5 || o.Every != 5*time.Second ||
		o.Executor == nil || o.Executor.String() != "noop" || len(o.Addrs) != 1 || o.Addrs[0] != "127.0.0.1:1" || o.Logger == nil {
		t.Fatalf("defaults %+v", o)
	}
	o = ok()
	o.Agents = 100000
	if err := o.Defaults(); err != nil || o.ConnsPerAddr != 64 {
		t.Fatalf("conns per addr %d (%v), want the cap 64", o.ConnsPerAddr, err)
	}
	for want, mod := range map[string]func(*FleetOptions){
		"agents: must be >= 1":              func(o *FleetOptions) { o.Agents = 0 },
		"region: at least one":              func(o *FleetOptions) { o.Addrs = []string{" "} },
		"cpu-millis, memory-mb, max-tasks:": func(o *FleetOptions) { o.MemoryMB = 0 },
		"start-rate: must be > 0":           func(o *FleetOptions) { o.StartRate = -1 },
		"conns-per-addr: must be >= 0":      func(o *FleetOptions) { o.ConnsPerAddr = -1 },
		"data-dir: required":                func(o *FleetOptions) { o.DataDir = "" },
	} {
		o := ok()
		mod(&o)
		if err := o.Defaults(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Defaults: %v; want %q", err, want)
		}
	}
}

// A fleet whose region never answers starts its agents at the start rate,
// registers none, stops when ctx ends, and counts its own CPU.
func TestRunFleetWithoutRegion(t *testing.T) {
	var samples []FleetSample
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	final, err := RunFleet(ctx, FleetOptions{Agents: 20, Addrs: []string{"127.0.0.1:1"}, CPUMillis: 1000, MemoryMB: 1024,
		DataDir: t.TempDir(), StartRate: 20, Every: 200 * time.Millisecond, Progress: func(s FleetSample) { samples = append(samples, s) }})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("stopping took %s", took)
	}
	if len(samples) < 3 || !final.Final || samples[len(samples)-1] != final {
		t.Fatalf("%d samples, final %+v", len(samples), final)
	}
	// 20 agents at 20/s: the first at once, the rest 50 ms apart; the
	// context ended before the last (at 950 ms) only on a slow machine.
	if final.Started < 15 || final.Registered != 0 || final.EverRegistered != 0 || final.AllRegisteredAfter != 0 ||
		final.Heartbeats != 0 || final.HarnessCPUSeconds <= 0 || final.HarnessRSSMiB <= 0 {
		t.Fatalf("final %+v", final)
	}
	if first := samples[0]; first.Started >= 20 {
		t.Fatalf("all 20 started by the first sample (%v): no ramp", first.Elapsed)
	}
	line := final.String()
	for _, want := range []string{"final t=", "agents ", "/20 started, 0 registered", "harness cpu", "rss"} {
		if !strings.Contains(line, want) {
			t.Fatalf("line %q lacks %q", line, want)
		}
	}
}
