package main

// apiary trace JOB_ID: a job's lifecycle from a span file, as an indented
// timeline in the terminal.

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/attribute"

	"apiary.dev/apiary/internal/telemetry"
)

func init() { register(newTraceCmd) }

func newTraceCmd() *cobra.Command {
	var (
		file  string
		color string
	)
	cmd := &cobra.Command{
		Use:   "trace JOB_ID",
		Short: "Draw a job's lifecycle (its trace) as a timeline",
		Long: `Draw a job's lifecycle as an indented timeline: every span of the job's trace
(submit, accept, each placement, dispatch, run, retry, complete or fail), its
start offset from the first span and its duration, the node and attempt, and
errors in red, so it is plain where the time went and why a task was retried.

Spans are read from a JSON-lines span file: --file, else $APIARY_TRACE_FILE
(apiary dev sets it and writes every process's spans to <data-dir>/traces.jsonl).
Processes write it with --trace-file. Spans are exported in batches, so the
last ones may take a few seconds to appear.`,
		Example: `  apiary trace eu-west-01HX... --file /tmp/apiary-dev/traces.jsonl`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				file = os.Getenv(telemetry.EnvTraceFile)
			}
			if file == "" {
				return withCode(exitInvalid, errors.New("no span file: give --file or set $"+telemetry.EnvTraceFile))
			}
			spans, err := telemetry.ReadSpanFile(file)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return withCode(exitInvalid, fmt.Errorf("span file %s does not exist", file))
				}
				return withCode(exitInvalid, err)
			}
			useColor := false
			switch color {
			case "always":
				useColor = true
			case "never":
			case "auto":
				if f, ok := cmd.OutOrStdout().(*os.File); ok && isTerminal(f) && os.Getenv("NO_COLOR") == "" {
					useColor = true
				}
			default:
				return withCode(exitInvalid, fmt.Errorf("--color: must be auto, always or never, got %q", color))
			}
			n, err := renderTrace(cmd.OutOrStdout(), spans, args[0], useColor)
			if err != nil {
				return err
			}
			if n == 0 {
				return withCode(exitInvalid, fmt.Errorf("no spans of job %s in %s (is tracing on? spans are flushed every few seconds)", args[0], file))
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "span file (JSON lines; default $"+telemetry.EnvTraceFile+")")
	cmd.Flags().StringVar(&color, "color", "auto", "color errors red: auto, always or never")
	return cmd
}

const (
	ansiRed   = "\x1b[31m"
	ansiReset = "\x1b[0m"
)

// renderTrace writes the timeline of every trace that holds a span of job
// and returns how many spans it drew.
func renderTrace(w io.Writer, all []telemetry.SpanRecord, job string, color bool) (int, error) {
	traces := map[string]bool{}
	for i := range all {
		if all[i].Attr(telemetry.AttrJobID) == job {
			traces[all[i].TraceID] = true
		}
	}
	var ids []string
	for id := range traces {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	total := 0
	for _, tid := range ids {
		var spans []*telemetry.SpanRecord
		seen := map[string]bool{}
		for i := range all {
			s := &all[i]
			if s.TraceID == tid && !seen[s.SpanID+s.Name] { // a span written twice is drawn once
				seen[s.SpanID+s.Name] = true
				spans = append(spans, s)
			}
		}
		total += len(spans)
		if err := drawTrace(w, tid, job, spans, color); err != nil {
			return total, err
		}
	}
	return total, nil
}

func drawTrace(w io.Writer, tid, job string, spans []*telemetry.SpanRecord, color bool) error {
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].Start.Before(spans[j].Start) })
	byID := map[string]*telemetry.SpanRecord{}
	for _, s := range spans {
		byID[s.SpanID] = s
	}
	children := map[string][]*telemetry.SpanRecord{}
	var roots []*telemetry.SpanRecord
	for _, s := range spans {
		if p := s.ParentSpanID; p != "" && byID[p] != nil && p != s.SpanID {
			children[p] = append(children[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	t0, end := spans[0].Start, spans[0].End
	for _, s := range spans {
		if s.End.After(end) {
			end = s.End
		}
	}
	// attempt of each deterministic run span id, to name link targets.
	runs := map[string]string{}
	for _, s := range spans {
		if s.Name == telemetry.SpanRun {
			runs[s.SpanID] = s.Attr(telemetry.AttrAttempt)
		}
	}
	fmt.Fprintf(w, "job %s  trace %s  %d spans  %s\n", job, tid, len(spans), fmtDur(end.Sub(t0)))
	fmt.Fprintf(w, "%9s %9s  %s\n", "START", "DURATION", "STEP")
	var draw func(s *telemetry.SpanRecord, depth int)
	draw = func(s *telemetry.SpanRecord, depth int) {
		name := strings.Repeat("  ", depth) + s.Name
		line := fmt.Sprintf("%9s %9s  %-*s", "+"+fmtDur(s.Start.Sub(t0)), fmtDur(s.End.Sub(s.Start)), max(24, len(name)), name)
		details := spanDetails(s, runs)
		if details != "" {
			line += "  " + details
		}
		line = strings.TrimRight(line, " ")
		if s.StatusCode == "error" {
			msg := "error: " + firstLine(s.StatusMsg)
			if color {
				line = ansiRed + line + "  " + msg + ansiReset
			} else {
				line += "  " + msg
			}
		}
		fmt.Fprintln(w, line)
		for _, c := range children[s.SpanID] {
			draw(c, depth+1)
		}
	}
	for _, r := range roots {
		draw(r, 0)
	}
	return nil
}

// spanDetails is the one-line summary of a span's attributes.
func spanDetails(s *telemetry.SpanRecord, runs map[string]string) string {
	var parts []string
	add := func(label string, k string) {
		if v := s.Attributes[k]; v != nil {
			parts = append(parts, label+"="+s.Attr(attribute.Key(k)))
		}
	}
	if s.Name == telemetry.SpanAccept || s.Name == telemetry.SpanSubmit || s.Name == telemetry.SpanRoute {
		add("region", "apiary.region")
		add("shard", "apiary.shard")
		add("tasks", "apiary.job.tasks")
	}
	add("task", "apiary.task.index")
	add("attempt", "apiary.attempt")
	add("node", "apiary.node.id")
	switch s.Name {
	case telemetry.SpanPlace:
		add("score", "apiary.placement.score")
		add("epoch", "apiary.epoch")
		if s.Attr(telemetry.AttrConflict) == "true" {
			parts = append(parts, "conflict: requeued")
		}
	case telemetry.SpanRun:
		add("pid", "process.pid")
		add("exit", "process.exit.code")
		add("output", "apiary.output.bytes")
	case telemetry.SpanComplete, telemetry.SpanFail, telemetry.SpanRetry, telemetry.SpanRefused, telemetry.SpanReclaim:
		add("outcome", "apiary.outcome")
	}
	if s.Kind == "server" || s.Kind == "client" {
		if s.Service != "" {
			parts = append(parts, "("+s.Service+")")
		}
	}
	for _, l := range s.Links {
		kind, _ := l.Attributes["apiary.link"].(string)
		if kind == "" {
			kind = "link"
		}
		target := "span " + l.SpanID
		if a, ok := runs[l.SpanID]; ok {
			target = "run of attempt " + a
		} else if a, ok := l.Attributes["apiary.attempt"]; ok {
			target = fmt.Sprintf("attempt %v", a)
		}
		parts = append(parts, kind+" "+target)
	}
	return strings.Join(parts, " ")
}

func fmtDur(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000)
	case d < time.Minute:
		return fmt.Sprintf("%.3fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
