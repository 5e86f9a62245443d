package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"apiary.dev/apiary/placement"
)

// traceDir is ../shared/traces/alibaba-gpu-v2023 relative to the repository
// root (the directory holding go.mod). A missing trace fails the test.
func traceDir(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("repository root (go.mod) not found")
		}
		dir = parent
	}
	td := filepath.Join(dir, "..", "shared", "traces", "alibaba-gpu-v2023")
	if _, err := os.Stat(filepath.Join(td, "openb_node_list_all_node.csv")); err != nil {
		t.Fatalf("trace missing: %v", err)
	}
	return td
}

func load(t testing.TB, taskFile string) ([]*placement.Node, []placement.Task) {
	t.Helper()
	td := traceDir(t)
	nf, err := os.Open(filepath.Join(td, "openb_node_list_all_node.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer nf.Close()
	nodes, err := ReadNodes(nf)
	if err != nil {
		t.Fatal(err)
	}
	tf, err := os.Open(filepath.Join(td, taskFile))
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	tasks, err := ReadTasks(tf)
	if err != nil {
		t.Fatal(err)
	}
	return GPUNodes(nodes), tasks
}

func TestTraceShape(t *testing.T) {
	nodes, tasks := load(t, "openb_pod_list_default.csv")
	gpus := 0
	for _, n := range nodes {
		gpus += n.Capacity.GPUs
	}
	if len(nodes) != 1213 || gpus != 6212 || len(tasks) != 8152 {
		t.Fatalf("%d GPU nodes, %d GPUs, %d tasks; want 1213, 6212, 8152", len(nodes), gpus, len(tasks))
	}
	_, spec := load(t, "openb_pod_list_gpuspec33.csv")
	constrained := 0
	for _, tk := range spec {
		if len(tk.GPUModels) > 0 {
			constrained++
		}
	}
	if constrained == 0 {
		t.Fatal("gpuspec33 tasks carry no GPU model constraints")
	}
}

// TestFragmentationBeatsBestFit replays seed 42 of the default trace: the
// fragmentation policy places more of the GPU demand than best-fit, which
// lands near the published 92.86%, and more than issue 3's 96% (96.14% on
// this seed; 95.89% without the packing charge).
func TestFragmentationBeatsBestFit(t *testing.T) {
	nodes, tasks := load(t, "openb_pod_list_default.csv")
	bf := Run(nodes, tasks, Config{Policy: placement.PolicyBestFit, Seed: 42})
	fr := Run(nodes, tasks, Config{Policy: placement.PolicyFragmentation, Seed: 42})
	t.Logf("best-fit %.2f%%, fragmentation %.2f%%", bf.GPUAllocPctAt100, fr.GPUAllocPctAt100)
	if bf.GPUAllocPctAt100 < 91 || bf.GPUAllocPctAt100 > 95 {
		t.Errorf("best-fit %.2f%%, want near the published 92.86%%", bf.GPUAllocPctAt100)
	}
	if fr.GPUAllocPctAt100 <= 96 || fr.GPUAllocPctAt100 < bf.GPUAllocPctAt100+2 {
		t.Errorf("fragmentation %.2f%%, want > 96%% and 2 points over best-fit", fr.GPUAllocPctAt100)
	}
	if fr.FragGPUPctAt100 >= bf.FragGPUPctAt100 {
		t.Errorf("fragmentation policy leaves more fragmentation (%.2f%%) than best-fit (%.2f%%)", fr.FragGPUPctAt100, bf.FragGPUPctAt100)
	}
	if fr.Arrived <= 8152 || fr.Placed == 0 || fr.Placed >= fr.Arrived {
		t.Errorf("arrived %d, placed %d", fr.Arrived, fr.Placed)
	}
	again := Run(nodes, tasks, Config{Policy: placement.PolicyFragmentation, Seed: 42})
	if again.GPUAllocPctAt100 != fr.GPUAllocPctAt100 || again.Placed != fr.Placed {
		t.Error("same seed, different outcome")
	}
}

func TestArrivals(t *testing.T) {
	trace := []placement.Task{{ID: "a", Request: placement.Resources{GPUs: 1}}, {ID: "b", Request: placement.Resources{GPUMilli: 500}}, {ID: "c"}}
	seq := Arrivals(trace, 1, 130, 10000)
	var sum int64
	for _, tk := range seq[:3] {
		sum += gpuMilli(tk.Request)
	}
	if sum != 1500 {
		t.Fatalf("the shuffled trace comes first: %v", seq[:3])
	}
	sum = 0
	for _, tk := range seq {
		sum += gpuMilli(tk.Request)
	}
	last := gpuMilli(seq[len(seq)-1].Request)
	if sum < 13000 || sum-last >= 13000 {
		t.Fatalf("total GPU request %d, want the first to reach 13000", sum)
	}
}

func TestReadErrors(t *testing.T) {
	cases := []struct{ name, nodes, tasks, want string }{
		{name: "node bad int", nodes: "sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,0,\nn2,x,1,0,\n", want: `line 3: cpu_milli "x" is not an integer`},
		{name: "node negative", nodes: "sn,cpu_milli,memory_mib,gpu,model\nn1,1,-5,0,\n", want: "line 2: memory_mib -5 is negative"},
		{name: "node missing column", nodes: "sn,cpu_milli,gpu,model\n", want: `line 1: missing column "memory_mib"`},
		{name: "node short row", nodes: "sn,cpu_milli,memory_mib,gpu,model\nn1,1,1\n", want: "line 2:"},
		{name: "node dup", nodes: "sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,0,\nn1,1,1,0,\n", want: "line 3: duplicate node"},
		{name: "gpu without model", nodes: "sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,2,\n", want: "line 2: node with 2 GPUs has no model"},
		{name: "share with many gpus", tasks: "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np1,1,1,2,500,\n", want: "line 2: a GPU share"},
		{name: "milli over 1000", tasks: "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np1,1,1,0,0,\np2,1,1,1,1500,\n", want: "line 3: gpu_milli 1500 out of range"},
		{name: "empty", tasks: "", want: "line 1: empty file"},
		{name: "column twice", tasks: "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,cpu_milli\n", want: `line 1: column "cpu_milli" appears twice (fields 2 and 7)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			if c.nodes != "" {
				_, err = ReadNodes(strings.NewReader(c.nodes))
			} else {
				_, err = ReadTasks(strings.NewReader(c.tasks))
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
		})
	}
	tasks, err := ReadTasks(strings.NewReader("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\np1,100,200,1,460,,LS\np2,1,1,8,1000,V100M16|V100M32,BE\np3,1,1,0,0,,LS\n"))
	if err != nil {
		t.Fatal(err)
	}
	if tasks[0].Request.GPUMilli != 460 || tasks[1].Request.GPUs != 8 || len(tasks[1].GPUModels) != 2 || tasks[2].Request.GPUs != 0 {
		t.Fatalf("parsed %+v", tasks)
	}
}

func TestParseFlags(t *testing.T) {
	s, err := ParseSeeds("42-51")
	if err != nil || len(s) != 10 || s[0] != 42 || s[9] != 51 {
		t.Fatalf("%v %v", s, err)
	}
	for in, want := range map[string]string{
		"5-1":      "start 5 is after end 1",
		"42-":      "both integers",
		"0-10000":  "more than 10000 seeds",
		"42,42":    "seed 42 listed twice",
		"40-45,44": "seed 44 listed twice",
		"x":        "want an integer",
		" , ":      "no seeds",
	} {
		if _, err := ParseSeeds(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSeeds(%q): %v, want an error with %q", in, err, want)
		}
	}
	for in, want := range map[string]string{
		"binpack,nope":    `unknown policy "nope"`,
		"":                `unknown policy ""`,
		"bestfit,bestfit": `policy "bestfit" listed twice`,
		"all,bestfit":     "all cannot be combined",
	} {
		if _, err := ParsePolicies(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePolicies(%q): %v, want an error with %q", in, err, want)
		}
	}
	if p, err := ParsePolicies("all"); err != nil || len(p) != len(AllPolicies) {
		t.Errorf("all: %v %v", p, err)
	}
}
