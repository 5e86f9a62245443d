package regional_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
)

// TestGPUsNotOvercommitted: one agent with 2 GPUs gets more whole-GPU and
// GPU-share tasks than fit at once. The scheduler must see the GPUs its
// running tasks hold (the snapshot's per-GPU free share), so every task is
// placed once and never refused by the agent: each ends on attempt 1. Each
// process is told its device (APIARY_GPU_DEVICES, CUDA_VISIBLE_DEVICES). (The
// coordinator once passed only a GPU count the engine does not read, so
// every round saw both GPUs idle and the agent refused the surplus.)
func TestGPUsNotOvercommitted(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{
		{ID: "g1", GPUs: 2, GPUModel: "t4", CPUMillis: 8000, MemoryMiB: 8192}}})
	c := dial(t, r)
	var ids []string
	for i := 0; i < 4; i++ {
		ids = append(ids, submit(t, c, spec(t, fmt.Sprintf(`
name: whole-%d
tasks:
  - name: train
    count: 2
    command: sh
    args: ["-c", "echo dev=$APIARY_GPU_DEVICES cuda=$CUDA_VISIBLE_DEVICES; sleep 0.4"]
    resources: {cpu_millis: 100, memory_mb: 64, gpus: 1}
`, i))))
	}
	ids = append(ids, submit(t, c, spec(t, `
name: shares
tasks:
  - name: infer
    count: 6
    command: sh
    args: ["-c", "echo dev=$APIARY_GPU_DEVICES cuda=$CUDA_VISIBLE_DEVICES milli=$APIARY_GPU_MILLI; sleep 0.3"]
    resources: {cpu_millis: 100, memory_mb: 64, gpu_milli: 500}
`)))
	for n, id := range ids {
		waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
		for _, tk := range logs(t, c, id) {
			if tk.GetAttempt() != 1 || len(tk.GetAttempts()) != 1 {
				t.Fatalf("job %s task %d: attempt %d, %d results (refused by the agent?): %+v",
					id, tk.GetIndex(), tk.GetAttempt(), len(tk.GetAttempts()), tk.GetAttempts())
			}
			// The process is told its device (the one the placement chose
			// and the agent gave), in both variables.
			out := strings.TrimSpace(tk.GetAttempts()[0].GetStdoutTail())
			okOut := map[string]bool{"dev=0 cuda=0": true, "dev=1 cuda=1": true}
			if n == len(ids)-1 {
				okOut = map[string]bool{"dev=0 cuda=0 milli=500": true, "dev=1 cuda=1 milli=500": true}
			}
			if !okOut[out] {
				t.Fatalf("job %s task %d printed %q", id, tk.GetIndex(), out)
			}
		}
	}
}

// TestGPUSharesExample runs examples/gpu-shares.yaml on one 4-GPU agent:
// two 650-milli shares, two 320s and a 2-GPU task, placed in one round by
// the fragmentation policy. The 320s go into the 650s' 350-milli gaps, so
// the shares use two devices and the 2-GPU task gets the other two, all at
// once and each on attempt 1. The region measures its GPU task mix from a
// file (--gpu-workload) instead of using the Alibaba trace's.
func TestGPUSharesExample(t *testing.T) {
	wl, err := filepath.Abs("testdata/gpu-workload.csv")
	if err != nil {
		t.Fatal(err)
	}
	_, r := cluster(t, devcluster.RegionSpec{Agents: []devcluster.AgentSpec{
		{ID: "g1", GPUs: 4, GPUModel: "A100", CPUMillis: 8000, MemoryMiB: 8192}},
		ExtraArgs: []string{"--gpu-workload", wl}})
	c := dial(t, r)
	data, err := os.ReadFile("../examples/gpu-shares.yaml")
	if err != nil {
		t.Fatal(err)
	}
	id := submit(t, c, spec(t, string(data)))
	waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 60*time.Second)
	milli := map[string]int{} // device -> milli of the shares on it
	var whole []string
	for _, tk := range logs(t, c, id) {
		if tk.GetAttempt() != 1 {
			t.Fatalf("task %s/%d: attempt %d", tk.GetGroup(), tk.GetIndex(), tk.GetAttempt())
		}
		out := strings.TrimSpace(tk.GetAttempts()[0].GetStdoutTail())
		var m int
		var dev string
		if _, err := fmt.Sscanf(out, "share %d of GPU %s", &m, &dev); err == nil {
			milli[dev] += m
			continue
		}
		if devs, ok := strings.CutPrefix(out, "whole GPUs "); ok {
			whole = strings.Split(devs, ",")
			continue
		}
		t.Fatalf("task %s/%d printed %q", tk.GetGroup(), tk.GetIndex(), out)
	}
	if len(milli) != 2 || len(whole) != 2 {
		t.Fatalf("shares on devices %v, whole GPUs %v; want the shares on 2 devices (650+320 each) and 2 whole GPUs", milli, whole)
	}
	for dev, m := range milli {
		if m != 970 {
			t.Errorf("device %s holds %d milli of shares, want 970 (650+320)", dev, m)
		}
	}
	for _, d := range whole {
		if _, shared := milli[d]; shared {
			t.Errorf("whole GPU %s also holds shares %v", d, milli)
		}
	}

	// gpu_models that no node has: accepted, with a warning naming the
	// models the region has (and the case hint); a model it has: none.
	for _, c2 := range []struct{ models, want string }{
		{"[a100]", `did you mean "A100"?`},
		{"[h100, v100]", "models here: A100"},
		{"[A100]", ""},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := c.jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: spec(t, "name: m\ntasks: [{name: a, command: 'true', resources: {gpus: 1, gpu_models: "+c2.models+"}}]\n")})
		cancel()
		if err != nil {
			t.Fatalf("gpu_models %s: %v", c2.models, err)
		}
		w := strings.Join(resp.GetWarnings(), "\n")
		if c2.want == "" && w != "" || c2.want != "" && !strings.Contains(w, c2.want) || c2.want != "" && !strings.Contains(w, "tasks[0].resources.gpu_models") {
			t.Errorf("gpu_models %s: warnings %q, want one containing %q", c2.models, w, c2.want)
		}
	}
}
