package loadtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadPodsRealTrace(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "shared", "traces", "alibaba-gpu-v2023", "openb_pod_list_default.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pods, err := ReadPods(f, 300)
	if err != nil || len(pods) != 300 {
		t.Fatalf("%d pods, %v", len(pods), err)
	}
	if pods[0].Name != "openb-pod-0000" || pods[0].CPUMilli != 12000 || pods[0].MemoryMiB != 16384 || pods[0].Lifetime() != 12537496 {
		t.Fatalf("first pod %+v", pods[0])
	}
}

func TestReadPodsRejectsMalformedRows(t *testing.T) {
	head := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
	for body, want := range map[string]string{
		"p,1,2,0,0,,LS,Running,x,5,0\n":      "line 2: creation_time",
		"p,1,2,0,0,,LS,Running,1,5,0\nq,1\n": "line 3",
		"p,-1,2,0,0,,LS,Running,1,5,0\n":     "line 2: cpu_milli",
	} {
		if _, err := ReadPods(strings.NewReader(head+body), 0); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%q: want error containing %q, got %v", body, want, err)
		}
	}
	if _, err := ReadPods(strings.NewReader("name,cpu\n"), 0); err == nil || !strings.Contains(err.Error(), "column") {
		t.Fatalf("missing columns: %v", err)
	}
}
