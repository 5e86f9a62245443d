package main

// apiary trace JOB_ID: a job's lifecycle, read from the processes' span
// buffers over the API (or from a span file), as an indented timeline in
// the terminal.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/telemetry"
)

func init() { register(newTraceCmd) }

// Spans still in flight: how long after an attempt ends its task.run span
// may still be on its way (an agent ships every telemetry.ShipInterval; a
// span file is written every telemetry.FileBatchInterval), and how often
// apiary trace looks again meanwhile.
const (
	bufferInFlight = telemetry.ShipInterval + 2*time.Second
	fileInFlight   = telemetry.FileBatchInterval + time.Second
	inFlightPoll   = 200 * time.Millisecond
)

func newTraceCmd() *cobra.Command {
	var (
		file  string
		color string
		o     clientOpts
	)
	cmd := &cobra.Command{
		Use:   "trace JOB_ID",
		Short: "Draw a job's lifecycle (its trace) as a timeline",
		Long: `Draw a job's lifecycle as an indented timeline: every span of the job's trace
(route, accept, each placement, dispatch, run, retry, complete or fail), its
start offset from the first span and its duration, the node and attempt, and
errors in red, so it is plain where the time went and why a task was retried.

By default the spans come over the API (--addr, else $APIARY_ADDR: a global
router or any coordinator of the job's region) from the span buffers that
every coordinator and router keeps in memory (--trace-buffer, on by default;
agents send their task.run spans to their coordinators every second). The
router adds only its own job.route span: another router replica's is not
shown.

With --file, or $APIARY_TRACE_FILE when --addr is not given, the spans come
from a JSON-lines span file that the processes write (--trace-file or
$APIARY_TRACE_FILE; apiary dev writes <data-dir>/traces.jsonl); it also
holds the client's job.submit span if apiary job run wrote to it too.

Spans still in flight: an agent sends a task.run span about a second after
the attempt ends, and a span file is written every 5 s. When a dispatched
attempt has ended but its task.run span has not arrived yet, apiary trace
waits for it (at most 3 s after the attempt ended over the API, 6 s after
the newest span with a file) and then says which are still missing. A
running attempt's task.run span appears when it ends.

-o json prints the spans of the job's traces as JSON lines (the span-file
format) instead of the timeline. A job with no spans exits 2.`,
		Example: `  apiary trace eu-west-01HX... --addr 127.0.0.1:7070
  apiary trace eu-west-01HX... --file /tmp/apiary-dev/traces.jsonl`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
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
			job := args[0]
			if !cmd.Flags().Changed("file") && !cmd.Flags().Changed("addr") {
				file = os.Getenv(telemetry.EnvTraceFile)
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			var src traceSource
			if file != "" {
				src = &fileSource{path: file}
			} else {
				cc, addr, err := o.conn(cmd)
				if err != nil {
					return err
				}
				defer cc.Close()
				src = &apiSource{o: &o, addr: addr, jobs: apiaryv1.NewJobServiceClient(cc)}
			}
			spans, pending, err := fetchSettled(ctx, src, job)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if o.output == "json" {
				for _, s := range jobSpans(spans, job) {
					if err := printSpanJSON(w, s); err != nil {
						return err
					}
				}
			} else if _, err := renderTrace(w, spans, job, useColor); err != nil {
				return err
			}
			if len(spans) == 0 || !hasJobSpan(spans, job) {
				return withCode(exitInvalid, src.noSpans(job))
			}
			for _, n := range src.notes() {
				fmt.Fprintln(cmd.ErrOrStderr(), "note:", n)
			}
			for _, p := range pending {
				fmt.Fprintln(cmd.ErrOrStderr(), "note:", p)
			}
			return nil
		},
	}
	o.addFlags(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "read a span file (JSON lines) instead of the API (default $"+telemetry.EnvTraceFile+" when --addr is not given)")
	cmd.Flags().StringVar(&color, "color", "auto", "color errors red: auto, always or never")
	return cmd
}

// traceSource is where apiary trace reads spans: the API or a span file.
type traceSource interface {
	// spans returns the spans (at least those of the job's traces) and,
	// when the source can tell, the progress of the job's attempts.
	spans(ctx context.Context, job string) ([]telemetry.SpanRecord, *jobProgress, error)
	// inFlight is how long after endedAt spans may still be on their way.
	inFlight() time.Duration
	// missingWhy says why a task.run span may be missing.
	missingWhy() string
	noSpans(job string) error
	notes() []string
}

// jobProgress is what the job itself says about its attempts (API only).
type jobProgress struct {
	running map[string]string    // "task/attempt" → node, attempts not ended
	ended   map[string]time.Time // "task/attempt" → when the attempt ended
}

type fileSource struct{ path string }

func (f *fileSource) spans(context.Context, string) ([]telemetry.SpanRecord, *jobProgress, error) {
	spans, err := telemetry.ReadSpanFile(f.path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, withCode(exitInvalid, fmt.Errorf("span file %s does not exist: processes write it when started with "+
				"--trace-file %s or $%s=%s; or leave out --file (and $%s) to read the processes' span buffers over the API with --addr",
				f.path, f.path, telemetry.EnvTraceFile, f.path, telemetry.EnvTraceFile))
		}
		return nil, nil, withCode(exitInvalid, err)
	}
	return spans, nil, nil
}

func (f *fileSource) inFlight() time.Duration { return fileInFlight }

func (f *fileSource) noSpans(job string) error {
	return fmt.Errorf("no spans of job %s in %s: every process whose spans you want must write to it (--trace-file %s or $%s), "+
		"and spans reach it in batches every %s; or leave out --file (and $%s) to read the processes' span buffers over the API with --addr",
		job, f.path, f.path, telemetry.EnvTraceFile, telemetry.FileBatchInterval, telemetry.EnvTraceFile)
}

func (f *fileSource) notes() []string { return nil }

func (f *fileSource) missingWhy() string {
	return fmt.Sprintf("processes append spans to the file every %s, and only those started with --trace-file %s (or $%s) do; "+
		"a killed agent's last spans are lost; run apiary trace again to look once more", telemetry.FileBatchInterval, f.path, telemetry.EnvTraceFile)
}

type apiSource struct {
	o    *clientOpts
	addr string
	jobs apiaryv1.JobServiceClient
	last *apiaryv1.GetJobTraceResponse
}

func (a *apiSource) spans(ctx context.Context, job string) ([]telemetry.SpanRecord, *jobProgress, error) {
	var resp *apiaryv1.GetJobTraceResponse
	err := a.o.call(ctx, func(ctx context.Context) error {
		var err error
		resp, err = a.jobs.GetJobTrace(ctx, &apiaryv1.GetJobTraceRequest{JobId: job}, grpc.MaxCallRecvMsgSize(cliconn.MaxRecvBytes))
		return err
	})
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return nil, nil, withCode(exitInvalid, fmt.Errorf("the server at %s does not serve traces (GetJobTrace: %s); "+
				"read a span file with --file instead", a.addr, status.Convert(err).Message()))
		}
		return nil, nil, rpcError(err, a.addr, "")
	}
	a.last = resp
	spans, err := telemetry.ReadSpans(bytes.NewReader(resp.GetSpansJsonl()))
	if err != nil {
		return nil, nil, withCode(exitUnavailable, fmt.Errorf("reading the spans from %s: %w", a.addr, err))
	}
	// The job's attempts, to tell a running attempt from a span in flight.
	var jr *apiaryv1.GetJobResponse
	if err := a.o.call(ctx, func(ctx context.Context) error {
		var err error
		jr, err = a.jobs.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: job}, grpc.MaxCallRecvMsgSize(cliconn.MaxRecvBytes))
		return err
	}); err != nil {
		if status.Code(err) == codes.NotFound && len(spans) == 0 {
			return nil, nil, rpcError(err, a.addr, "job "+job)
		}
		return spans, nil, nil
	}
	p := &jobProgress{running: map[string]string{}, ended: map[string]time.Time{}}
	for _, t := range jr.GetJob().GetTasks() {
		switch t.GetState() {
		case apiaryv1.TaskState_TASK_STATE_ASSIGNED, apiaryv1.TaskState_TASK_STATE_RUNNING:
			p.running[attemptKey(strconv.Itoa(int(t.GetIndex())), strconv.Itoa(int(t.GetAttempt())))] = t.GetNodeId()
		}
		for _, r := range t.GetAttempts() {
			if r.GetEndTimeMs() > 0 {
				p.ended[attemptKey(strconv.Itoa(int(t.GetIndex())), strconv.Itoa(int(r.GetAttempt())))] = time.UnixMilli(r.GetEndTimeMs())
			}
		}
	}
	return spans, p, nil
}

func (a *apiSource) inFlight() time.Duration { return bufferInFlight }

func (a *apiSource) missingWhy() string {
	return fmt.Sprintf("agents send their spans to a coordinator every %s; a killed agent's last spans, and those in the buffer "+
		"of a coordinator that restarted since, are lost; run apiary trace again to look once more", telemetry.ShipInterval)
}

func (a *apiSource) noSpans(job string) error {
	msg := fmt.Sprintf("no spans of job %s in the span buffers reached through %s. Each coordinator and router keeps its last "+
		"--trace-buffer spans (default %d, at most %s) in memory: a process that restarted since has lost them, and a process "+
		"started with --trace-buffer 0 or OTEL_SDK_DISABLED=true keeps none. A span file written with --trace-file can be read with --file",
		job, a.addr, telemetry.DefaultBufferSpans, telemetry.DefaultBufferAge)
	if n := a.notes(); len(n) > 0 {
		msg += " (" + strings.Join(n, "; ") + ")"
	}
	return errors.New(msg)
}

func (a *apiSource) notes() []string {
	if a.last == nil {
		return nil
	}
	var out []string
	for _, u := range a.last.GetUnavailable() {
		out = append(out, "not answering, its spans are missing: "+u)
	}
	if nr := a.last.GetNotRecording(); len(nr) > 0 {
		out = append(out, "keeping no span buffer: "+strings.Join(nr, ", "))
	}
	return out
}

func attemptKey(task, attempt string) string { return task + "/" + attempt }

// fetchSettled reads the job's spans and, while a dispatched attempt that
// has ended lacks its task.run span and that span may still be in flight,
// reads again. It returns the spans and a note per attempt whose run span
// is missing.
func fetchSettled(ctx context.Context, src traceSource, job string) ([]telemetry.SpanRecord, []string, error) {
	limit := time.Now().Add(src.inFlight()) // whatever the clocks of the span ends say
	for {
		spans, prog, err := src.spans(ctx, job)
		if err != nil {
			return nil, nil, err
		}
		missing, newest := missingRuns(spans, job)
		var notes []string
		var waitUntil time.Time
		for _, m := range missing {
			key := attemptKey(m.task, m.attempt)
			if prog != nil {
				if node, ok := prog.running[key]; ok {
					notes = append(notes, fmt.Sprintf("task %s attempt %s is still running on %s: its task.run span is sent when it ends", m.task, m.attempt, node))
					continue
				}
			}
			until := newest.Add(src.inFlight())
			if prog != nil {
				if ended, ok := prog.ended[key]; ok {
					until = ended.Add(src.inFlight())
				}
			}
			if until.After(waitUntil) {
				waitUntil = until
			}
			notes = append(notes, fmt.Sprintf("task %s attempt %s (node %s) was dispatched but no task.run span has arrived: %s",
				m.task, m.attempt, m.node, src.missingWhy()))
		}
		if waitUntil.After(limit) {
			waitUntil = limit
		}
		if waitUntil.IsZero() || !time.Now().Before(waitUntil) {
			return spans, notes, nil
		}
		select {
		case <-ctx.Done():
			return spans, notes, nil
		case <-time.After(min(inFlightPoll, time.Until(waitUntil))):
		}
	}
}

type missingRun struct{ task, attempt, node string }

// missingRuns lists the job's task.dispatch spans with no task.run span of
// the same task and attempt, and returns the newest span end.
func missingRuns(spans []telemetry.SpanRecord, job string) ([]missingRun, time.Time) {
	runs := map[string]bool{}
	var newest time.Time
	for i := range spans {
		s := &spans[i]
		if s.End.After(newest) {
			newest = s.End
		}
		if s.Name == telemetry.SpanRun && s.Attr(telemetry.AttrJobID) == job {
			runs[attemptKey(s.Attr(telemetry.AttrTaskIndex), s.Attr(telemetry.AttrAttempt))] = true
		}
	}
	var out []missingRun
	seen := map[string]bool{}
	for i := range spans {
		s := &spans[i]
		if s.Name != telemetry.SpanDispatch || s.Attr(telemetry.AttrJobID) != job {
			continue
		}
		k := attemptKey(s.Attr(telemetry.AttrTaskIndex), s.Attr(telemetry.AttrAttempt))
		if !runs[k] && !seen[k] {
			seen[k] = true
			out = append(out, missingRun{s.Attr(telemetry.AttrTaskIndex), s.Attr(telemetry.AttrAttempt), s.Attr(telemetry.AttrNodeID)})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].task != out[j].task {
			return out[i].task < out[j].task
		}
		return out[i].attempt < out[j].attempt
	})
	return out, newest
}

// jobSpans returns the spans of every trace that holds a span of job.
func jobSpans(all []telemetry.SpanRecord, job string) []telemetry.SpanRecord {
	traces := map[string]bool{}
	for i := range all {
		if all[i].Attr(telemetry.AttrJobID) == job {
			traces[all[i].TraceID] = true
		}
	}
	var out []telemetry.SpanRecord
	for _, s := range all {
		if traces[s.TraceID] {
			out = append(out, s)
		}
	}
	return out
}

func hasJobSpan(spans []telemetry.SpanRecord, job string) bool {
	for i := range spans {
		if spans[i].Attr(telemetry.AttrJobID) == job {
			return true
		}
	}
	return false
}

func printSpanJSON(w io.Writer, s telemetry.SpanRecord) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
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
