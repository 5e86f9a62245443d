package loadtest

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// Pod is one row of a cluster-trace-gpu-v2023 pod list
// (openb_pod_list_*.csv): resources in millicores and MiB, times in seconds
// from the trace start.
type Pod struct {
	Name           string
	CPUMilli       int64
	MemoryMiB      int64
	GPUs           int64
	GPUMilli       int64
	QoS            string
	Create, Delete int64
}

// Lifetime is Delete - Create in seconds (0 if the pod never ended).
func (p Pod) Lifetime() int64 { return max(p.Delete-p.Create, 0) }

// ReadPods reads up to limit pods (all if limit <= 0) from a pod list CSV with
// the trace's own columns. A malformed row is an error naming its line.
func ReadPods(r io.Reader, limit int) ([]Pod, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("line 1: %w", err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[h] = i
	}
	for _, c := range []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time"} {
		if _, ok := col[c]; !ok {
			return nil, fmt.Errorf("line 1: column %q is missing", c)
		}
	}
	var out []Pod
	for line := 2; limit <= 0 || len(out) < limit; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if len(rec) != len(head) {
			return nil, fmt.Errorf("line %d: %d fields, header has %d", line, len(rec), len(head))
		}
		num := func(c string, empty int64) (int64, error) {
			s := rec[col[c]]
			if s == "" {
				return empty, nil
			}
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil || v < 0 {
				return 0, fmt.Errorf("line %d: %s: %q is not a non-negative integer", line, c, s)
			}
			return v, nil
		}
		p := Pod{Name: rec[col["name"]], QoS: rec[col["qos"]]}
		for _, f := range []struct {
			col   string
			dst   *int64
			empty int64
		}{{"cpu_milli", &p.CPUMilli, 0}, {"memory_mib", &p.MemoryMiB, 0}, {"num_gpu", &p.GPUs, 0},
			{"gpu_milli", &p.GPUMilli, 0}, {"creation_time", &p.Create, 0}, {"deletion_time", &p.Delete, -1}} {
			if *f.dst, err = num(f.col, f.empty); err != nil {
				return nil, err
			}
		}
		if p.Delete < 0 {
			p.Delete = p.Create
		}
		out = append(out, p)
	}
	return out, nil
}
