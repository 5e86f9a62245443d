package sim

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestReadEveryPublishedTrace reads every CSV of the shared Alibaba trace
// directory with the reader its name calls for (a missing directory fails,
// as in traceDir), then, for each task list, the same rows cut down to the
// required columns only: the shape of the trace's openb_pod_list_multigpu*
// and gpushare* lists (name,cpu_milli,memory_mib,num_gpu,gpu_milli: no
// gpu_spec, qos or times), which must give the same tasks without model
// constraints. Dropping any one required column is refused, naming it.
func TestReadEveryPublishedTrace(t *testing.T) {
	td := traceDir(t)
	files, err := filepath.Glob(filepath.Join(td, "*.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no CSV files in %s", td)
	}
	required := []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}
	for _, path := range files {
		base := filepath.Base(path)
		t.Run(base, func(t *testing.T) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case strings.HasPrefix(base, "openb_node_list"):
				nodes, err := ReadNodes(strings.NewReader(string(b)))
				if err != nil || len(nodes) == 0 {
					t.Fatalf("ReadNodes: %d nodes, %v", len(nodes), err)
				}
			case strings.HasPrefix(base, "openb_pod_list"):
				tasks, err := ReadTasks(strings.NewReader(string(b)))
				if err != nil || len(tasks) == 0 {
					t.Fatalf("ReadTasks: %d tasks, %v", len(tasks), err)
				}
				cut, err := ReadTasks(strings.NewReader(keepColumns(t, b, required)))
				if err != nil {
					t.Fatalf("ReadTasks on the required columns only: %v", err)
				}
				if len(cut) != len(tasks) {
					t.Fatalf("required columns only: %d tasks, want %d", len(cut), len(tasks))
				}
				for i := range cut {
					if cut[i].ID != tasks[i].ID || cut[i].Request != tasks[i].Request || len(cut[i].GPUModels) != 0 {
						t.Fatalf("row %d: %+v from the required columns, want %+v without models", i+2, cut[i], tasks[i])
					}
				}
				for _, drop := range required {
					cols := slices.DeleteFunc(slices.Clone(required), func(c string) bool { return c == drop })
					_, err := ReadTasks(strings.NewReader(keepColumns(t, b, cols)))
					if want := `line 1: missing column "` + drop + `"`; err == nil || !strings.Contains(err.Error(), want) {
						t.Errorf("without %s: err %v, want %q", drop, err, want)
					}
				}
			default:
				t.Fatalf("no reader for %s: want openb_node_list_* or openb_pod_list_*", base)
			}
		})
	}
}

// keepColumns returns the CSV b with only the named columns, in that order.
func keepColumns(t *testing.T, b []byte, cols []string) string {
	t.Helper()
	recs, err := csv.NewReader(strings.NewReader(string(b))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	idx := make([]int, len(cols))
	for i, c := range cols {
		if idx[i] = slices.Index(recs[0], c); idx[i] < 0 {
			t.Fatalf("column %q not in header %v", c, recs[0])
		}
	}
	var sb strings.Builder
	w := csv.NewWriter(&sb)
	for _, r := range recs {
		out := make([]string, len(idx))
		for i, j := range idx {
			out[i] = r[j]
		}
		_ = w.Write(out)
	}
	w.Flush()
	return sb.String()
}
