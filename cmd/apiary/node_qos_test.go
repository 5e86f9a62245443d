package main

import (
	"bytes"
	"strings"
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// TestPrintNodesRequestsAndLimits: node list shows the running tasks'
// requests beside the sum of their limits (Node.limits), "-" for a
// resource no task limits, and keeps the requests over capacity.
func TestPrintNodesRequestsAndLimits(t *testing.T) {
	nodes := []*apiaryv1.Node{
		{Region: "eu-west", Id: "n1", Status: apiaryv1.NodeStatus_NODE_STATUS_READY, Epoch: 3,
			Capacity:  &apiaryv1.Resources{CpuMillis: 4000, MemoryMb: 8192},
			Allocated: &apiaryv1.Resources{CpuMillis: 1500, MemoryMb: 2048},
			Limits:    &apiaryv1.ResourceLimits{CpuMillis: 6000, MemoryMb: 3072}},
		{Region: "eu-west", Id: "n2", Status: apiaryv1.NodeStatus_NODE_STATUS_READY, Epoch: 1,
			Capacity:  &apiaryv1.Resources{CpuMillis: 2000, MemoryMb: 1024},
			Allocated: &apiaryv1.Resources{CpuMillis: 500, MemoryMb: 256},
			Limits:    &apiaryv1.ResourceLimits{MemoryMb: 256}},
		{Region: "eu-west", Id: "n3", Status: apiaryv1.NodeStatus_NODE_STATUS_READY, Epoch: 1,
			Capacity: &apiaryv1.Resources{CpuMillis: 2000, MemoryMb: 1024}},
	}
	var out, errw bytes.Buffer
	printNodes(&out, &errw, nodes)
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want a header and 3 nodes:\n%s", len(lines), out.String())
	}
	col := func(line, name string) string {
		t.Helper()
		i := strings.Index(lines[0], name)
		if i < 0 {
			t.Fatalf("no column %q in %q", name, lines[0])
		}
		f := strings.Fields(line[i:])
		return f[0]
	}
	for _, tc := range []struct {
		line                           int
		cpu, mem, cpuReqLim, memReqLim string
	}{
		{1, "1500/4000", "2048/8192", "1500/6000", "2048/3072"},
		{2, "500/2000", "256/1024", "500/-", "256/256"},
		{3, "0/2000", "0/1024", "0/-", "0/-"},
	} {
		l := lines[tc.line]
		for name, want := range map[string]string{"CPU (m)": tc.cpu, "MEMORY (MiB)": tc.mem,
			"CPU REQ/LIM (m)": tc.cpuReqLim, "MEM REQ/LIM (MiB)": tc.memReqLim} {
			if got := col(l, name); got != want {
				t.Errorf("line %d, %s = %q, want %q:\n%s", tc.line, name, got, want, out.String())
			}
		}
	}
}
