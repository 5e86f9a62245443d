// Package sim replays a task trace onto a node list with the placement
// engine alone (no cluster): the what-if simulation behind
// `apiary placement simulate` and the quality benchmark. Like placement it
// does no I/O of its own; it reads from the io.Readers it is given.
//
// The method is the one of the FGD paper's evaluation (Weng et al., USENIX
// ATC 2023, §6): the trace's tasks are shuffled with a seed, then tasks
// drawn uniformly with replacement are appended until the total GPU request
// reaches a multiple of the cluster's GPU capacity (130% by default); tasks
// arrive one by one and never leave; each gets one placement try and is
// dropped if it fits nowhere. The headline metric is the GPU allocation
// ratio at the moment the arrived GPU demand reaches 100% of capacity.
package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"apiary.dev/apiary/placement"
)

// ReadNodes parses a node list with the columns of the Alibaba GPU trace
// (cluster-trace-gpu-v2023, openb_node_list_*.csv): sn, cpu_milli,
// memory_mib, gpu, model; other columns are ignored, order is free. A
// malformed row is an error naming its line.
func ReadNodes(r io.Reader) ([]*placement.Node, error) {
	rows, col, err := readCSV(r, "sn", "cpu_milli", "memory_mib", "gpu", "model")
	if err != nil {
		return nil, err
	}
	var out []*placement.Node
	seen := map[string]int{}
	for _, row := range rows {
		f := row.fields
		id := strings.TrimSpace(f[col["sn"]])
		if id == "" {
			return nil, fmt.Errorf("line %d: empty sn", row.line)
		}
		if l, dup := seen[id]; dup {
			return nil, fmt.Errorf("line %d: duplicate node %q (first on line %d)", row.line, id, l)
		}
		seen[id] = row.line
		v, err := row.nonNegs(col, "cpu_milli", "memory_mib", "gpu")
		if err != nil {
			return nil, err
		}
		cpu, mem, gpu := v[0], v[1], v[2]
		if gpu > 1024 {
			return nil, fmt.Errorf("line %d: gpu %d out of range", row.line, gpu)
		}
		model := strings.TrimSpace(f[col["model"]])
		if gpu > 0 && model == "" {
			return nil, fmt.Errorf("line %d: node with %d GPUs has no model", row.line, gpu)
		}
		out = append(out, &placement.Node{
			ID:       id,
			Capacity: placement.Resources{CPUMillis: cpu, MemoryMiB: mem, GPUs: int(gpu)},
			GPUModel: model,
		})
	}
	return out, nil
}

// ReadTasks parses a task list with the columns of the Alibaba GPU trace
// (openb_pod_list_*.csv): name, cpu_milli, memory_mib, num_gpu and gpu_milli
// are required, gpu_spec is optional, other columns (qos, pod_phase, the
// times) are ignored and may be absent, as in the trace's multigpu and
// gpushare lists. num_gpu 1 with gpu_milli below 1000 is a share of one GPU;
// otherwise gpu_milli must be 1000 and the task takes num_gpu whole GPUs.
// gpu_spec, when present and not empty, is a "|"-separated list of allowed
// GPU models; without it a task accepts any model. A file without a
// required column is an error naming the column.
func ReadTasks(r io.Reader) ([]placement.Task, error) {
	rows, col, err := readCSV(r, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	specCol, hasSpec := col["gpu_spec"]
	out := make([]placement.Task, 0, len(rows))
	for _, row := range rows {
		f := row.fields
		name := strings.TrimSpace(f[col["name"]])
		if name == "" {
			return nil, fmt.Errorf("line %d: empty name", row.line)
		}
		v, err := row.nonNegs(col, "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
		if err != nil {
			return nil, err
		}
		cpu, mem, ng, gm := v[0], v[1], v[2], v[3]
		req := placement.Resources{CPUMillis: cpu, MemoryMiB: mem}
		switch {
		case ng == 0 && gm == 0:
		case ng == 0:
			return nil, fmt.Errorf("line %d: gpu_milli %d without num_gpu", row.line, gm)
		case gm == 0 || gm > 1000:
			return nil, fmt.Errorf("line %d: gpu_milli %d out of range 1..1000", row.line, gm)
		case gm < 1000 && ng != 1:
			return nil, fmt.Errorf("line %d: a GPU share (gpu_milli %d) needs num_gpu 1, got %d", row.line, gm, ng)
		case gm < 1000:
			req.GPUMilli = int(gm)
		case ng > 1024:
			return nil, fmt.Errorf("line %d: num_gpu %d out of range", row.line, ng)
		default:
			req.GPUs = int(ng)
		}
		var models []string
		spec := ""
		if hasSpec {
			spec = strings.TrimSpace(f[specCol])
		}
		if spec != "" {
			for _, m := range strings.Split(spec, "|") {
				if m = strings.TrimSpace(m); m != "" {
					models = append(models, m)
				}
			}
		}
		out = append(out, placement.Task{ID: name, Request: req, GPUModels: models})
	}
	return out, nil
}

type csvRow struct {
	line   int
	fields []string
}

func readCSV(r io.Reader, need ...string) ([]csvRow, map[string]int, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = false
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("line 1: empty file, want a header with %s", strings.Join(need, ","))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("line 1: %w", err)
	}
	col := map[string]int{}
	for i, h := range header {
		h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		if j, dup := col[h]; dup && h != "" {
			return nil, nil, fmt.Errorf("line 1: column %q appears twice (fields %d and %d)", h, j+1, i+1)
		}
		col[h] = i
	}
	var missing []string
	for _, n := range need {
		if _, ok := col[n]; !ok {
			missing = append(missing, strconv.Quote(n))
		}
	}
	if len(missing) > 0 {
		plural := ""
		if len(missing) > 1 {
			plural = "s"
		}
		return nil, nil, fmt.Errorf("line 1: missing column%s %s (required: %s; header %q)",
			plural, strings.Join(missing, ", "), strings.Join(need, ","), strings.Join(header, ","))
	}
	var rows []csvRow
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		line, _ := cr.FieldPos(0)
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return nil, nil, fmt.Errorf("line %d: %v", pe.Line, pe.Err)
			}
			return nil, nil, fmt.Errorf("line %d: %w", line, err)
		}
		if len(rec) != len(header) {
			return nil, nil, fmt.Errorf("line %d: %d fields, header has %d", line, len(rec), len(header))
		}
		rows = append(rows, csvRow{line: line, fields: rec})
	}
	return rows, col, nil
}

// nonNegs parses the named columns of row as non-negative integers, in the
// order named; the first bad one is the error.
func (row csvRow) nonNegs(col map[string]int, names ...string) ([]int64, error) {
	vs := make([]int64, len(names))
	for i, name := range names {
		v, err := nonNeg(row.fields[col[name]], name, row.line)
		if err != nil {
			return nil, err
		}
		vs[i] = v
	}
	return vs, nil
}

func nonNeg(s, name string, line int) (int64, error) {
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("line %d: %s %q is not an integer", line, name, s)
	}
	if v < 0 {
		return 0, fmt.Errorf("line %d: %s %d is negative", line, name, v)
	}
	return v, nil
}
