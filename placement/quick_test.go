package placement

import "testing"

func TestQuickBinpack(t *testing.T) {
	snap := &Snapshot{Nodes: []*Node{
		{ID: "a", Capacity: Resources{CPUMillis: 4000, MemoryMiB: 4096}},
		{ID: "b", Capacity: Resources{CPUMillis: 4000, MemoryMiB: 4096}, Allocated: Resources{CPUMillis: 2000, MemoryMiB: 2048}},
	}}
	p := New(Options{}).Place(snap, []Task{{ID: "t1", Request: Resources{CPUMillis: 1000, MemoryMiB: 1024}}, {ID: "t2", Request: Resources{CPUMillis: 1000, MemoryMiB: 1024}}, {ID: "t3", Request: Resources{CPUMillis: 4000, MemoryMiB: 1024}}, {ID: "t4", Request: Resources{CPUMillis: 4000, MemoryMiB: 1024}}})
	t.Logf("%+v", p)
	if len(p.Placements) != 3 || p.Placements[0].NodeID != "b" || p.Placements[1].NodeID != "b" || p.Placements[2].NodeID != "a" {
		t.Fatalf("plan %+v", p)
	}
	if len(p.Unplaced) != 1 || p.Unplaced[0].Reason != "cpu: 2 nodes" {
		t.Fatalf("unplaced %+v", p.Unplaced)
	}
}
