package main

import (
	"bytes"
	"regexp"
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// dataset list inverts the nodes' lists: one block per dataset (by name),
// its holders largest copy first, DOWN nodes left out.
func TestDatasetHolders(t *testing.T) {
	ready := apiaryv1.NodeStatus_NODE_STATUS_READY
	nodes := []*apiaryv1.Node{
		{Id: "n1", Region: "eu-west", Status: ready, Datasets: []*apiaryv1.LocalDataset{{Name: "model", SizeBytes: 10}, {Name: "inputs-a", SizeBytes: 1 << 20}}},
		{Id: "n2", Region: "eu-west", Status: ready, Datasets: []*apiaryv1.LocalDataset{{Name: "model", SizeBytes: 4096}}},
		{Id: "n3", Region: "eu-west", Status: apiaryv1.NodeStatus_NODE_STATUS_DOWN, Datasets: []*apiaryv1.LocalDataset{{Name: "gone", SizeBytes: 1}}},
	}
	out := datasetHolders(nodes)
	if len(out.GetDatasets()) != 2 || out.GetDatasets()[0].GetName() != "inputs-a" || out.GetDatasets()[1].GetName() != "model" {
		t.Fatalf("datasets %v, want inputs-a and model (the DOWN node's left out)", out.GetDatasets())
	}
	if h := out.GetDatasets()[1].GetHolders(); len(h) != 2 || h[0].GetNodeId() != "n2" || h[1].GetNodeId() != "n1" {
		t.Fatalf("holders of model %v, want n2 (4096) then n1 (10)", h)
	}
	var b bytes.Buffer
	printDatasets(&b, out)
	t.Logf("\n%s", b.String())
	for _, re := range []string{`(?m)^DATASET\s+REGION\s+NODE\s+BYTES$`, `(?m)^inputs-a\s+eu-west\s+n1\s+1\.0 MiB \(1048576\)$`,
		`(?m)^model\s+eu-west\s+n2\s+4\.0 KiB \(4096\)\n\s+eu-west\s+n1\s+10 B \(10\)$`} {
		if !regexp.MustCompile(re).MatchString(b.String()) {
			t.Errorf("output does not match %s", re)
		}
	}
	b.Reset()
	printDatasets(&b, datasetHolders(nil))
	if !regexp.MustCompile(`no node holds a dataset`).MatchString(b.String()) {
		t.Errorf("empty list printed %q", b.String())
	}
}

// job status says when a task runs away from its input datasets, and how
// many bytes that is.
func TestPrintJobFetchHint(t *testing.T) {
	job := &apiaryv1.Job{Id: "eu-west-1", Spec: &apiaryv1.JobSpec{Name: "j"}, Tasks: []*apiaryv1.Task{
		{Index: 0, State: apiaryv1.TaskState_TASK_STATE_RUNNING, NodeId: "n2", FetchBytes: 50000},
		{Index: 1, State: apiaryv1.TaskState_TASK_STATE_RUNNING, NodeId: "n1"},
	}}
	var b bytes.Buffer
	printJob(&b, job)
	if !regexp.MustCompile(`(?m)^fetch: task 0 runs on n2, which lacks 49 KiB of its input datasets`).MatchString(b.String()) {
		t.Fatalf("no fetch hint for task 0 in:\n%s", b.String())
	}
	if regexp.MustCompile(`fetch: task 1`).MatchString(b.String()) {
		t.Fatal("a fetch hint for a task on its data's node")
	}
}
