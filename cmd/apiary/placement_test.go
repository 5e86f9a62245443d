package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlacementSimulate runs `apiary placement simulate` as a user does, on
// a small trace in the Alibaba CSV format: text and JSON output, and bad
// flags and files refused with exit 2 and the flag or line named.
func TestPlacementSimulate(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	nodes := write("nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\n"+
		"n1,32000,131072,4,T4\nn2,32000,131072,4,T4\nn3,64000,262144,8,V100M16\n")
	tasks := write("tasks.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"+
		"p1,4000,8192,1,1000,,LS\np2,2000,4096,1,470,,LS\np3,2000,4096,1,320,,LS\n"+
		"p4,2000,4096,1,650,,LS\np5,8000,16384,2,1000,,LS\np6,1000,2048,0,0,,BE\n")

	r := runCLI(t, nil, "placement", "simulate", "--nodes", nodes, "--tasks", tasks, "--policy", "bestfit,fragmentation", "--seeds", "1-3")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "3 nodes, 6 trace tasks, seeds 1-3 (n=3)") ||
		!strings.Contains(r.stdout, "bestfit ") || !strings.Contains(r.stdout, "fragmentation ") {
		t.Fatalf("text output:\n%s", r.stdout)
	}

	r = runCLI(t, nil, "placement", "simulate", "--nodes", nodes, "--tasks", tasks, "--policy", "fragmentation", "--seeds", "7", "--output", "json")
	if r.code != 0 {
		t.Fatalf("json: exit %d: %s", r.code, r.stderr)
	}
	var doc struct {
		Policies map[string]map[string]any `json:"policies"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("json output: %v\n%s", err, r.stdout)
	}
	fr := doc.Policies["fragmentation"]
	num := func(k string) float64 { f, _ := fr[k].(float64); return f }
	if len(doc.Policies) != 1 || num("n") != 1 || num("gpu_alloc_pct_at_100") <= 0 || num("gpu_alloc_pct_at_100") > 100 ||
		num("placements_per_s") <= 0 {
		t.Fatalf("json output: %s", r.stdout)
	}
	for _, k := range []string{"cpu_alloc_pct_at_100", "frag_gpu_pct_at_100", "gpu_alloc_pct_at_100_min", "gpu_alloc_pct_at_100_max"} {
		if _, ok := fr[k]; !ok {
			t.Errorf("json output lacks %q: %s", k, r.stdout)
		}
	}

	bad := write("bad.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np1,1,1,0,0,\np2,abc,1,0,0,\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tasks", tasks}, "--nodes and --tasks are required"},
		{[]string{"--nodes", nodes, "--tasks", bad}, `bad.csv: line 3: cpu_milli "abc" is not an integer`},
		{[]string{"--nodes", filepath.Join(dir, "none.csv"), "--tasks", tasks}, "--nodes: open"},
		{[]string{"--nodes", nodes, "--tasks", tasks, "--policy", "bestfitt"}, `unknown policy "bestfitt"`},
		{[]string{"--nodes", nodes, "--tasks", tasks, "--seeds", "51-42"}, "start 51 is after end 42"},
		{[]string{"--nodes", nodes, "--tasks", tasks, "--seeds", "1,1"}, "seed 1 listed twice"},
		{[]string{"--nodes", nodes, "--tasks", tasks, "--candidates", "-7"}, "--candidates -7"},
		{[]string{"--nodes", nodes, "--tasks", tasks, "--arrival", "50"}, "--arrival 50 out of range"},
	} {
		r := runCLI(t, nil, append([]string{"placement", "simulate"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("simulate %v: exit %d, stderr %q; want exit 2 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

// TestRegionGPUWorkloadErrors: `apiary region --gpu-workload` refuses a
// file it cannot use before starting anything, naming the flag and line.
func TestRegionGPUWorkloadErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.csv")
	noGPU := filepath.Join(dir, "nogpu.csv")
	if err := os.WriteFile(bad, []byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np1,1,1,1,470,\np2,1,1,1,4700,\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(noGPU, []byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np1,1000,1024,0,0,\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, want string }{
		{bad, "--gpu-workload: " + bad + ": line 3: gpu_milli 4700 out of range"},
		{noGPU, "no GPU tasks"},
		{filepath.Join(dir, "none.csv"), "--gpu-workload: open"},
	} {
		r := runCLI(t, nil, "region", "--region", "r1", "--data-dir", filepath.Join(dir, "d"), "--gpu-workload", c.file)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("--gpu-workload %s: exit %d, stderr %q; want exit 2 and %q", filepath.Base(c.file), r.code, r.stderr, c.want)
		}
		if _, err := os.Stat(filepath.Join(dir, "d")); err == nil {
			t.Errorf("--gpu-workload %s: the data dir was created", filepath.Base(c.file))
		}
	}
}

// sharedTrace returns ../shared/traces/alibaba-gpu-v2023/NAME relative to the
// repository root; a missing file fails the test (as in placement/sim).
func sharedTrace(t *testing.T, name string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		if filepath.Dir(dir) == dir {
			t.Fatal("repository root (go.mod) not found")
		}
		dir = filepath.Dir(dir)
	}
	p := filepath.Join(dir, "..", "shared", "traces", "alibaba-gpu-v2023", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("trace missing: %v", err)
	}
	return p
}

// TestPlacementSimulateMultiGPU50: `apiary placement simulate` runs on a task
// list shaped like the trace's published openb_pod_list_multigpu50.csv and
// multigpu20.csv, whose header is name,cpu_milli,memory_mib,num_gpu,gpu_milli
// (no gpu_spec, qos or times); the shared directory holds the default list,
// so the test cuts it to those columns. A list without a required column
// exits 2 naming the file and the column.
func TestPlacementSimulateMultiGPU50(t *testing.T) {
	nodes := sharedTrace(t, "openb_node_list_all_node.csv")
	b, err := os.ReadFile(sharedTrace(t, "openb_pod_list_default.csv"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cut := func(name string, cols int) string {
		var sb strings.Builder
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Split(line, ",")
			sb.WriteString(strings.Join(f[:cols], ",") + "\n")
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if !strings.HasPrefix(string(b), "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,") {
		t.Fatalf("default list's header changed: %.80q", b)
	}
	multi := cut("openb_pod_list_multigpu50.csv", 5)
	r := runCLI(t, nil, "placement", "simulate", "--nodes", nodes, "--tasks", multi, "--policy", "bestfit", "--seeds", "42", "--candidates", "0")
	if r.code != 0 || !strings.Contains(r.stdout, "1213 nodes, 8152 trace tasks") || !strings.Contains(r.stdout, "bestfit ") {
		t.Fatalf("simulate on the multigpu50 columns: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	noMilli := cut("no-gpu-milli.csv", 4)
	r = runCLI(t, nil, "placement", "simulate", "--nodes", nodes, "--tasks", noMilli)
	if want := "--tasks: " + noMilli + `: line 1: missing column "gpu_milli"`; r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Fatalf("simulate without gpu_milli: exit %d, stderr %q; want exit 2 and %q", r.code, r.stderr, want)
	}
}
