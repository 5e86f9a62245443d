package main

// apiary job run|status|list|cancel|logs: the client side of JobService.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/ids"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/lifecycle"
	"apiary.dev/apiary/internal/telemetry"
	"apiary.dev/apiary/placement"
)

func init() { register(newJobCmd) }

func newJobCmd() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{
		Use:   "job",
		Short: "Submit, inspect and cancel jobs",
		Long: `Submit, inspect and cancel jobs.

The API address comes from --addr, else $APIARY_ADDR, else 127.0.0.1:7070.
Exit codes: 0 success (with --wait: the job completed), 1 the job failed or was
cancelled, 2 invalid input (nothing was submitted) or not found, 3 the API is
unavailable (after retrying for --timeout; within about 1.5 s when every
address refuses the connection), 4 --wait-timeout passed before the job ended
(the job keeps running), 130 interrupted while waiting.`,
	}
	o.addFlags(cmd)
	cmd.AddCommand(newJobRunCmd(o), newJobStatusCmd(o), newJobListCmd(o), newJobCancelCmd(o), newJobLogsCmd(o))
	return cmd
}

// ---------------------------------------------------------------------------
// job run

func newJobRunCmd(o *clientOpts) *cobra.Command {
	var wait bool
	var waitTimeout time.Duration
	var requestID, namespace string
	cmd := &cobra.Command{
		Use:   "run FILE",
		Short: "Validate a job file and submit it",
		Long: `Validate a job file and submit it.

The file is parsed and validated locally first; an invalid file exits 2 and
nothing is sent. The submission carries a client id (stable for this host and
user) and a fresh request id; it is retried with the same request id while the
API is unavailable, up to --timeout, so a retry never makes a second job.

With --wait, follows the job until it ends: exit 0 if it completed, 1 if it
failed or was cancelled. --timeout then also bounds each reconnection. While
tasks are pending, it prints to stderr why they wait (the scheduler's reason,
e.g. "waiting: constraint zone = mars: 3 nodes"): when the reason first
appears or changes, and again at most every 10 s while nothing else changes.
--wait-timeout DURATION (implies --wait) stops waiting after DURATION with
exit 4: the job keeps running; follow it with 'apiary job status JOB_ID'.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if waitTimeout < 0 {
				return withCode(exitInvalid, fmt.Errorf("--wait-timeout must be >= 0 (0: wait until the job ends; got %s)", waitTimeout))
			}
			if waitTimeout > 0 {
				wait = true
			}
			if cmd.Flags().Changed("request-id") && !ids.Idempotency.MatchString(requestID) {
				return withCode(exitInvalid, fmt.Errorf("--request-id %q: must be 1 to 128 letters, digits or ._:@-", requestID))
			}
			if cmd.Flags().Changed("namespace") {
				if err := checkNamespace(namespace); err != nil {
					return err
				}
			}
			spec, err := loadJobFile(args[0])
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("namespace") {
				spec.Namespace = namespace
			}
			jobspec.ApplyDefaults(spec)
			// Tracing is on when OTEL_* or $APIARY_TRACE_FILE is set; the
			// submit span is the root of the job's trace.
			tp, stopTracing, err := (&telemetryFlags{sampleRatio: 1}).setup("apiary-cli", "")
			if err != nil {
				return withCode(exitInvalid, err)
			}
			defer stopTracing()
			cc, addr, err := o.conn(cmd)
			if err != nil {
				return err
			}
			defer cc.Close()
			ctx, stop := signalContext(cmd)
			defer stop()
			client := apiaryv1.NewJobServiceClient(cc)
			sctx, span := telemetry.Tracer(tp).Start(ctx, telemetry.SpanSubmit, trace.WithSpanKind(trace.SpanKindClient),
				trace.WithAttributes(telemetry.AttrJobName.String(spec.GetName()), telemetry.AttrTaskCount.Int(jobspec.TaskCount(spec))))
			req := &apiaryv1.SubmitJobRequest{
				Spec:        spec,
				ClientId:    cliconn.ClientID(),
				RequestId:   cmp.Or(requestID, cliconn.NewRequestID()),
				Traceparent: telemetry.Traceparent(sctx),
				// A generated key only guards this command's own retries;
				// --request-id is a key that holds across routers and regions.
				EphemeralRequestId: requestID == "",
			}
			var resp *apiaryv1.SubmitJobResponse
			err = o.call(sctx, func(ctx context.Context) error {
				var err error
				resp, err = client.SubmitJob(ctx, req)
				return err
			})
			if err != nil {
				telemetry.RecordError(span, err)
				span.End()
				return rpcError(err, addr, "")
			}
			span.SetAttributes(telemetry.AttrJobID.String(resp.GetJobId()), telemetry.AttrRegion.String(resp.GetRegion()))
			span.End()
			out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
			for _, w := range resp.GetWarnings() {
				fmt.Fprintf(errw, "warning: %s\n", w)
			}
			if !wait {
				if o.output == "json" {
					return printJSON(out, resp)
				}
				dedup := ""
				if resp.GetDeduplicated() {
					dedup = " (already submitted; same job)"
				}
				fmt.Fprintf(errw, "submitted %s (%s) to region %s%s\n", spec.GetName(), plural(int(jobspec.TaskCount(spec)), "task"), resp.GetRegion(), dedup)
				fmt.Fprintln(out, resp.GetJobId())
				return nil
			}
			if o.output == "text" {
				fmt.Fprintf(errw, "submitted %s as %s (region %s); waiting for it to finish\n", spec.GetName(), resp.GetJobId(), resp.GetRegion())
			}
			job, err := waitJob(ctx, o, client, addr, resp.GetJobId(), errw, waitTimeout)
			if job == nil {
				return err
			}
			// On --wait-timeout, job is the last state seen: print it too.
			if o.output == "json" {
				if err := printJSON(out, job); err != nil {
					return err
				}
			} else {
				printJob(out, job)
			}
			if err != nil {
				return err
			}
			return jobExit(job)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the job ends; exit 0 if it completed, 1 if not")
	cmd.Flags().DurationVar(&waitTimeout, "wait-timeout", 0, "with --wait (implied), stop waiting after this long and exit 4; the job keeps running (0: wait until it ends)")
	cmd.Flags().StringVar(&requestID, "request-id", "", "idempotency key: running the same file again with the same key (as the same user on the same host) returns the first job instead of submitting another; default a fresh random key")
	cmd.Flags().StringVar(&namespace, "namespace", "", "submit the job in this namespace, overriding the file's (default: the file's, else \"default\"); with ACLs on, the token needs submit on it")
	return cmd
}

// checkNamespace validates a --namespace value (exit 2, before dialing).
func checkNamespace(ns string) error {
	if err := acl.ValidateNamespace(ns); err != nil {
		return withCode(exitInvalid, fmt.Errorf("--%w", err))
	}
	return nil
}

// namespaceOf is a job's namespace as shown: "default" when unset.
func namespaceOf(spec *apiaryv1.JobSpec) string { return acl.OrDefault(spec.GetNamespace()) }

// loadJobFile parses and validates a job file; every problem exits 2.
func loadJobFile(path string) (*apiaryv1.JobSpec, error) {
	spec, err := jobspec.ParseFile(path)
	if err == nil {
		err = jobspec.Validate(spec)
	}
	if err == nil {
		return spec, nil
	}
	var ve *jobspec.ValidationError
	if errors.As(err, &ve) {
		lines := make([]string, 0, len(ve.Errors)+1)
		for _, fe := range ve.Errors {
			lines = append(lines, "  "+fe.String())
		}
		if ve.Omitted > 0 {
			lines = append(lines, fmt.Sprintf("  ... and %d more errors", ve.Omitted))
		}
		return nil, withCode(exitInvalid, fmt.Errorf("%s is not a valid job file (nothing was submitted):\n%s", path, strings.Join(lines, "\n")))
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, withCode(exitInvalid, fmt.Errorf("job file %s does not exist", path))
	}
	return nil, withCode(exitInvalid, fmt.Errorf("cannot read job file: %w", err))
}

func terminal(s apiaryv1.JobState) bool {
	switch s {
	case apiaryv1.JobState_JOB_STATE_COMPLETE, apiaryv1.JobState_JOB_STATE_FAILED, apiaryv1.JobState_JOB_STATE_CANCELLED,
		apiaryv1.JobState_JOB_STATE_MOVED:
		return true
	}
	return false
}

// jobExit maps a terminal job to the command's exit code.
func jobExit(job *apiaryv1.Job) error {
	switch job.GetState() {
	case apiaryv1.JobState_JOB_STATE_COMPLETE:
		return nil
	case apiaryv1.JobState_JOB_STATE_FAILED, apiaryv1.JobState_JOB_STATE_CANCELLED:
		return withCode(exitJobFailed, fmt.Errorf("job %s %s", job.GetId(), strings.ToLower(jobState(job.GetState()))))
	}
	return nil
}

// waitReminder is the shortest interval at which `job run --wait` prints why
// a job's tasks wait, when the reason changes or nothing else happens.
const waitReminder = 10 * time.Second

// errWaitTimeout is the cause of the wait ending at --wait-timeout.
var errWaitTimeout = errors.New("--wait-timeout passed")

// waitJob follows WatchJob until the job is terminal. A broken stream is
// reopened (the coordinator may have failed over); if the API stays
// unreachable for --timeout, it gives up with exit 3. A server without
// WatchJob is polled with GetJob. With waitTimeout > 0 it stops after that
// long with exit 4, returning the last state seen (nil if none) with the
// error. Progress lines go to progress with text output (see waitProgress).
func waitJob(ctx context.Context, o *clientOpts, client apiaryv1.JobServiceClient, addr, id string, progress io.Writer,
	waitTimeout time.Duration) (*apiaryv1.Job, error) {
	started := time.Now()
	if waitTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, waitTimeout, errWaitTimeout)
		defer cancel()
	}
	p := &waitProgress{start: started}
	if o.output == "text" {
		p.w = progress
		stop := p.remind(ctx)
		defer stop()
	}
	report := func(job *apiaryv1.Job) { p.seen(job, time.Now()) }
	lastContact := time.Now()
	contact := func() { lastContact = time.Now() }
	poll := false // the server has no WatchJob: poll GetJob instead
	for n := 0; ; n++ {
		var err error
		if !poll {
			var job *apiaryv1.Job
			job, err = watchOnce(ctx, client, id, func(j *apiaryv1.Job) { contact(); n = 0; report(j) })
			if err == nil && job != nil {
				return job, nil
			}
			if status.Code(err) == codes.Unimplemented {
				poll, err = true, nil
			}
		}
		if err == nil {
			// The stream ended early, or we poll: ask once.
			cctx, cancel := context.WithTimeout(ctx, min(perCallTimeout, o.timeout))
			var resp *apiaryv1.GetJobResponse
			resp, err = client.GetJob(cctx, &apiaryv1.GetJobRequest{JobId: id})
			cancel()
			if err == nil {
				contact()
				n = 0
				report(resp.GetJob())
				if terminal(resp.GetJob().GetState()) {
					return resp.GetJob(), nil
				}
				pause := 200 * time.Millisecond // before reopening the stream
				if poll {
					pause = time.Second
				}
				if err = lifecycle.Sleep(ctx, pause); err == nil {
					continue
				}
			}
		}
		if ctx.Err() != nil {
			last := p.lastJob()
			if errors.Is(context.Cause(ctx), errWaitTimeout) {
				return last, waitTimedOut(id, last, waitTimeout)
			}
			what := "stopped waiting"
			if last != nil {
				what += fmt.Sprintf("; job %s is %s and keeps running", id, strings.ToLower(jobState(last.GetState())))
			}
			return nil, withCode(exitInterrupted, errors.New(what))
		}
		code := status.Code(err)
		if !cliconn.Retryable(err) && code != codes.DeadlineExceeded && code != codes.Internal && code != codes.Unknown {
			return nil, rpcError(err, addr, "job "+id)
		}
		if time.Since(lastContact) > o.timeout {
			return nil, rpcError(&cliconn.RetryError{Attempts: n + 1, Last: err}, addr, "")
		}
		_ = lifecycle.Sleep(ctx, cliconn.DefaultBackoff.Wait(n)) // ctx end is handled above next round
	}
}

// watchOnce reads one WatchJob stream. It returns the job once it is
// terminal, (nil, nil) when the stream ended early, or the stream's error.
func watchOnce(ctx context.Context, client apiaryv1.JobServiceClient, id string, seen func(*apiaryv1.Job)) (*apiaryv1.Job, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.WatchJob(ctx, &apiaryv1.WatchJobRequest{JobId: id})
	if err != nil {
		return nil, err
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		job := resp.GetJob()
		seen(job)
		if terminal(job.GetState()) {
			return job, nil
		}
	}
}

// waitTimedOut is the exit-4 error of --wait-timeout: the job keeps running.
func waitTimedOut(id string, last *apiaryv1.Job, waitTimeout time.Duration) error {
	state := "in an unknown state (no answer about it yet)"
	if last != nil {
		state = strings.ToLower(jobState(last.GetState()))
		if r := pendingReason(last); r != "" {
			state += " (waiting: " + r + ")"
		}
	}
	return withCode(exitWaitTimeout, fmt.Errorf("stopped waiting after --wait-timeout %s: job %s is %s and keeps running; "+
		"follow it with `apiary job status %s` (or stop it with `apiary job cancel %s`)", waitTimeout, id, state, id, id))
}

// progressSummary is the state and task counts of a progress line.
func progressSummary(job *apiaryv1.Job) string {
	c := job.GetCounts()
	return fmt.Sprintf("%s: %s  %d/%d complete, %d running, %d pending, %d failed",
		job.GetId(), jobState(job.GetState()), c.GetComplete(), countTotal(c),
		c.GetRunning()+c.GetAssigned(), c.GetPending(), c.GetFailed())
}

// gpuModelHint follows an unplaced reason that names GPU models.
const gpuModelHint = "gpu_models must equal a node's GPU model exactly, case included: see `apiary node list`"

// pendingReason is why the job's first pending task with a reason waits
// (the scheduler's unplaced reason), or "".
func pendingReason(job *apiaryv1.Job) string {
	for _, t := range job.GetTasks() {
		if t.GetState() == apiaryv1.TaskState_TASK_STATE_PENDING && t.GetUnplacedReason() != "" {
			r := t.GetUnplacedReason()
			if strings.Contains(r, placement.ReasonGPUModel) {
				r += " (" + gpuModelHint + ")"
			}
			return r
		}
	}
	return ""
}

// progressLine is the summary and, so that a job that cannot be placed does
// not just sit there, why its pending tasks wait.
func progressLine(job *apiaryv1.Job) string {
	line := progressSummary(job)
	if r := pendingReason(job); r != "" {
		line += "; waiting: " + r
	}
	return line
}

// waitProgress prints the progress lines of `job run --wait` to w (nil: none,
// for JSON output): a line whenever the job's state or task counts change;
// while tasks are pending, the reason they wait when it first appears, a
// changed reason at most every waitReminder, and the line again (with the
// time waited) when nothing was printed for waitReminder. Safe for
// concurrent use (the reminder runs on its own goroutine).
type waitProgress struct {
	w     io.Writer
	start time.Time

	mu       sync.Mutex
	last     *apiaryv1.Job
	summary  string    // state and counts last printed
	reason   string    // reason last printed
	printed  time.Time // last line
	reasonAt time.Time // last line with a reason
}

func (p *waitProgress) lastJob() *apiaryv1.Job {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// seen takes a new state of the job, observed at now.
func (p *waitProgress) seen(job *apiaryv1.Job, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = job
	if p.w == nil {
		return
	}
	sum, reason := progressSummary(job), pendingReason(job)
	if sum == p.summary && (reason == "" || reason == p.reason || (!p.reasonAt.IsZero() && now.Sub(p.reasonAt) < waitReminder)) {
		return
	}
	p.print(job, now, "")
}

// tick repeats the last line when tasks are pending and nothing was printed
// for waitReminder.
func (p *waitProgress) tick(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w == nil || p.last == nil || terminal(p.last.GetState()) || p.last.GetCounts().GetPending() == 0 ||
		now.Sub(p.printed) < waitReminder {
		return
	}
	p.print(p.last, now, fmt.Sprintf(" [still waiting after %s]", now.Sub(p.start).Round(time.Second)))
}

func (p *waitProgress) print(job *apiaryv1.Job, now time.Time, suffix string) {
	p.summary, p.reason, p.printed = progressSummary(job), pendingReason(job), now
	if p.reason != "" {
		p.reasonAt = now
	}
	fmt.Fprintln(p.w, progressLine(job)+suffix)
}

// remind calls tick every second until ctx ends or the returned stop is
// called.
func (p *waitProgress) remind(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				p.tick(now)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// ---------------------------------------------------------------------------
// job status

func newJobStatusCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "status JOB_ID",
		Short: "Show a job and each of its tasks",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewJobServiceClient, "job "+id,
				func(ctx context.Context, c apiaryv1.JobServiceClient) (*apiaryv1.GetJobResponse, error) {
					return c.GetJob(ctx, &apiaryv1.GetJobRequest{JobId: id})
				})
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp.GetJob(), func(w io.Writer) { printJob(w, resp.GetJob()) })
		},
	}
}

func jobState(s apiaryv1.JobState) string {
	return strings.TrimPrefix(s.String(), "JOB_STATE_")
}

func taskState(s apiaryv1.TaskState) string {
	return strings.TrimPrefix(s.String(), "TASK_STATE_")
}

// failoverLine describes a failover job: where it may move and after how
// long, why it cannot, or where it moved.
func failoverLine(job *apiaryv1.Job) string {
	fo := job.GetFailover()
	after := (time.Duration(fo.GetAfterMs()) * time.Millisecond).String()
	switch {
	case job.GetState() == apiaryv1.JobState_JOB_STATE_MOVED:
		return fmt.Sprintf("moved to region %s (epoch %d) at %s: that region runs it now; nothing of it runs here",
			fo.GetActiveRegion(), fo.GetEpoch(), fmtTime(fo.GetMovedTimeMs()))
	case fo.GetEpoch() > 0:
		return fmt.Sprintf("moved here from region %s (epoch %d) at %s, after its home was down for %s", fo.GetHomeRegion(), fo.GetEpoch(),
			fmtTime(fo.GetMovedTimeMs()), after)
	case fo.GetNotEligible() != "":
		return "cannot fail over: " + fo.GetNotEligible()
	case fo.GetHeld() != "":
		return "HELD: nothing of it is placed and its reports wait: " + fo.GetHeld()
	}
	return fmt.Sprintf("to %s if region %s is down for %s", strings.Join(fo.GetStandbys(), " or "), fo.GetHomeRegion(), after)
}

func countTotal(c *apiaryv1.TaskCounts) int32 {
	return c.GetPending() + c.GetAssigned() + c.GetRunning() + c.GetComplete() + c.GetFailed() + c.GetCancelled()
}

// printJob writes a job header and a table of its tasks.
func printJob(w io.Writer, job *apiaryv1.Job) {
	state := jobState(job.GetState())
	if job.GetCancelRequested() && !terminal(job.GetState()) {
		state += " (cancel requested)"
	}
	c := job.GetCounts()
	h := newTable(w)
	fmt.Fprintf(h, "Job:\t%s\n", job.GetId())
	fmt.Fprintf(h, "Name:\t%s\n", cell(job.GetSpec().GetName(), 0))
	fmt.Fprintf(h, "Namespace:\t%s\n", namespaceOf(job.GetSpec()))
	fmt.Fprintf(h, "Region:\t%s (shard %d)\n", cell(job.GetRegion(), 0), job.GetShard())
	fmt.Fprintf(h, "State:\t%s\n", state)
	if fo := job.GetFailover(); fo != nil {
		fmt.Fprintf(h, "Failover:\t%s\n", failoverLine(job))
	}
	if sch := job.GetScheduler(); sch != "" {
		if job.GetSpec().GetScheduler() == "" {
			sch += " (the region's default)"
		}
		fmt.Fprintf(h, "Scheduler:\t%s\n", sch)
	}
	fmt.Fprintf(h, "Tasks:\t%d total: %d complete, %d running, %d assigned, %d pending, %d failed, %d cancelled\n",
		countTotal(c), c.GetComplete(), c.GetRunning(), c.GetAssigned(), c.GetPending(), c.GetFailed(), c.GetCancelled())
	printSecretEnv(h, job.GetSpec())
	fmt.Fprintf(h, "Submitted:\t%s\n", fmtTime(job.GetSubmitTimeMs()))
	fmt.Fprintf(h, "Finished:\t%s\n", fmtTime(job.GetFinishTimeMs()))
	h.Flush()
	if len(job.GetTasks()) == 0 {
		return
	}
	fmt.Fprintln(w)
	t := newTable(w)
	fmt.Fprintln(t, "INDEX\tGROUP\tSTATE\tATTEMPT\tNODE\tEXIT\tUNPLACED_REASON\tERROR")
	for _, task := range job.GetTasks() {
		exit := "-"
		if as := task.GetAttempts(); len(as) > 0 {
			if l := as[len(as)-1]; l.GetEndTimeMs() > 0 || l.GetOutcome() != "" {
				exit = strconv.Itoa(int(l.GetExitCode()))
			}
		}
		reason := task.GetUnplacedReason()
		if task.GetState() == apiaryv1.TaskState_TASK_STATE_PENDING && task.GetNotBeforeMs() > time.Now().UnixMilli() {
			wait := time.Until(time.UnixMilli(task.GetNotBeforeMs())).Round(100 * time.Millisecond)
			reason = strings.TrimSpace(fmt.Sprintf("retry in %s %s", wait, reason))
		}
		fmt.Fprintf(t, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", task.GetIndex(), cell(task.GetGroup(), 24),
			taskState(task.GetState()), task.GetAttempt(), cell(task.GetNodeId(), 32), exit,
			cell(reason, 80), cell(task.GetError(), 80))
	}
	t.Flush()
	for _, task := range job.GetTasks() {
		if b := task.GetFetchBytes(); b > 0 && task.GetNodeId() != "" {
			fmt.Fprintf(w, "\nfetch: task %d runs on %s, which lacks %s of its input datasets (running where its data is would not have moved them)\n",
				task.GetIndex(), task.GetNodeId(), humanize.IBytes(uint64(b)))
		}
	}
	for _, task := range job.GetTasks() {
		if task.GetState() == apiaryv1.TaskState_TASK_STATE_PENDING && strings.Contains(task.GetUnplacedReason(), placement.ReasonGPUModel) {
			fmt.Fprintf(w, "\nnote: %s\n", gpuModelHint)
			break
		}
	}
}

// ---------------------------------------------------------------------------
// job list

func newJobListCmd(o *clientOpts) *cobra.Command {
	var state, namespace, pageToken string
	var limit int32
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List jobs, a page at a time, in descending job id order",
		Long: `List jobs, a page of --limit at a time, in descending job id order: a job id
starts with its region and then sorts by submission time, so each region's
jobs come together, newest first. When more follow, the page token of the
next page is printed on stderr; pass it as --page-token. A page can hold
fewer jobs than --limit, or none, and still be followed by more (a
coordinator whose job index lags reads etcd instead, a bounded amount per
page): list until no token is printed. Without
--namespace, the jobs of every namespace the caller may read (with ACLs on,
those its token's policies grant read on; all of them without ACLs).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var st apiaryv1.JobState
			check := func() error {
				var err error
				if st, err = parseJobState(state); err != nil {
					return withCode(exitInvalid, err)
				}
				if limit < 1 || limit > 10000 {
					return withCode(exitInvalid, fmt.Errorf("--limit must be between 1 and 10000 (got %d)", limit))
				}
				if pageToken != "" && !ids.IsJobID(pageToken) {
					return withCode(exitInvalid, fmt.Errorf("--page-token must be the token a previous page printed (a job id, <region>-<20 chars>), got %q", pageToken))
				}
				if cmd.Flags().Changed("namespace") {
					return checkNamespace(namespace)
				}
				return nil
			}
			resp, err := unaryCall(cmd, o, check, apiaryv1.NewJobServiceClient, "",
				func(ctx context.Context, c apiaryv1.JobServiceClient) (*apiaryv1.ListJobsResponse, error) {
					return c.ListJobs(ctx, &apiaryv1.ListJobsRequest{State: st, Limit: limit, Namespace: namespace, PageToken: pageToken})
				})
			if err != nil {
				return err
			}
			if u := resp.GetUnavailableRegions(); len(u) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: these regions did not answer, their jobs are missing: %s\n", strings.Join(u, ", "))
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) {
				t := newTable(w)
				fmt.Fprintln(t, "ID\tNAMESPACE\tNAME\tSTATE\tCOMPLETE\tFAILED\tREGION\tSUBMITTED")
				for _, j := range resp.GetJobs() {
					c := j.GetCounts()
					fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\n", j.GetId(), cell(namespaceOf(j.GetSpec()), 0), cell(j.GetSpec().GetName(), 40),
						jobState(j.GetState()), c.GetComplete(), countTotal(c), c.GetFailed(), cell(j.GetRegion(), 0),
						fmtTime(j.GetSubmitTimeMs()))
				}
				t.Flush()
				if len(resp.GetJobs()) == 0 && resp.GetNextPageToken() == "" {
					fmt.Fprintln(cmd.ErrOrStderr(), "no jobs")
				}
				if next := resp.GetNextPageToken(); next != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), "more jobs follow: --page-token %s\n", next)
				}
			})
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only jobs in this state: pending, running, complete, failed or cancelled")
	cmd.Flags().Int32Var(&limit, "limit", 100, "at most this many jobs per page (1..10000)")
	cmd.Flags().StringVar(&pageToken, "page-token", "", "the page after this token (printed after a page when more jobs follow)")
	cmd.Flags().StringVar(&namespace, "namespace", "", "only jobs of this namespace (default: every namespace the caller may read)")
	return cmd
}

func parseJobState(s string) (apiaryv1.JobState, error) {
	if s == "" {
		return apiaryv1.JobState_JOB_STATE_UNSPECIFIED, nil
	}
	u := strings.ToUpper(strings.TrimSpace(s))
	u = strings.TrimPrefix(u, "JOB_STATE_")
	if u == "CANCELED" {
		u = "CANCELLED"
	}
	if v, ok := apiaryv1.JobState_value["JOB_STATE_"+u]; ok && v != 0 {
		return apiaryv1.JobState(v), nil
	}
	return 0, fmt.Errorf("--state must be one of pending, running, complete, failed, cancelled (got %q)", s)
}

// ---------------------------------------------------------------------------
// job cancel

func newJobCancelCmd(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel JOB_ID",
		Short: "Cancel a job; its running attempts are killed",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			resp, err := unaryCall(cmd, o, nil, apiaryv1.NewJobServiceClient, "job "+id,
				func(ctx context.Context, c apiaryv1.JobServiceClient) (*apiaryv1.CancelJobResponse, error) {
					return c.CancelJob(ctx, &apiaryv1.CancelJobRequest{JobId: id})
				})
			if err != nil {
				return err
			}
			job := resp.GetJob()
			return o.print(cmd.OutOrStdout(), job, func(w io.Writer) {
				switch s := job.GetState(); {
				case s == apiaryv1.JobState_JOB_STATE_CANCELLED:
					fmt.Fprintf(w, "job %s cancelled\n", id)
				case terminal(s):
					fmt.Fprintf(w, "job %s had already ended (%s); nothing to cancel\n", id, strings.ToLower(jobState(s)))
				default:
					fmt.Fprintf(w, "job %s: cancel requested; %s still running will be killed\n",
						id, plural(int(job.GetCounts().GetRunning()+job.GetCounts().GetAssigned()), "task"))
				}
			})
		},
	}
}

// ---------------------------------------------------------------------------
// job logs

func newJobLogsCmd(o *clientOpts) *cobra.Command {
	var task int32
	cmd := &cobra.Command{
		Use:   "logs JOB_ID",
		Short: "Show the kept stdout/stderr tails of each task's attempts",
		Long: `Show the kept stdout/stderr tails of each task's attempts.

The region keeps the last part of each attempt's output (16 KiB by default);
full logs stay on the node that ran the attempt.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			check := func() error {
				if task < -1 {
					return withCode(exitInvalid, fmt.Errorf("--task must be a task index >= 0 (got %d)", task))
				}
				return nil
			}
			what := "job " + id
			if task >= 0 {
				what = fmt.Sprintf("task %d of job %s", task, id)
			}
			resp, err := unaryCall(cmd, o, check, apiaryv1.NewJobServiceClient, what,
				func(ctx context.Context, c apiaryv1.JobServiceClient) (*apiaryv1.GetJobLogsResponse, error) {
					return c.GetJobLogs(ctx, &apiaryv1.GetJobLogsRequest{JobId: id, TaskIndex: task}, grpc.MaxCallRecvMsgSize(cliconn.MaxRecvBytes))
				})
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w io.Writer) { printLogs(w, resp.GetTasks()) })
		},
	}
	cmd.Flags().Int32Var(&task, "task", -1, "only this task index (default: all tasks)")
	return cmd
}

func printLogs(w io.Writer, tasks []*apiaryv1.Task) {
	for i, t := range tasks {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "==> task %d [%s] %s, %d attempt(s)", t.GetIndex(), t.GetGroup(), taskState(t.GetState()), len(t.GetAttempts()))
		if t.GetError() != "" {
			fmt.Fprintf(w, ": %s", cell(t.GetError(), 200))
		}
		fmt.Fprintln(w)
		if len(t.GetAttempts()) == 0 {
			if r := t.GetUnplacedReason(); r != "" {
				fmt.Fprintf(w, "    (not run yet: %s)\n", cell(r, 200))
			} else {
				fmt.Fprintln(w, "    (not run yet)")
			}
		}
		for _, a := range t.GetAttempts() {
			dur := ""
			if a.GetStartTimeMs() > 0 && a.GetEndTimeMs() >= a.GetStartTimeMs() {
				dur = ", " + (time.Duration(a.GetEndTimeMs()-a.GetStartTimeMs()) * time.Millisecond).String()
			}
			outcome := a.GetOutcome()
			if outcome == "" {
				outcome = "running"
			}
			outcome += faultNote(a)
			fmt.Fprintf(w, "--- attempt %d on %s: %s, exit %d%s", a.GetAttempt(), cell(a.GetNodeId(), 0), outcome, a.GetExitCode(), dur)
			if a.GetError() != "" {
				fmt.Fprintf(w, " (%s)", cell(a.GetError(), 200))
			}
			fmt.Fprintln(w)
			printTail(w, "stdout", a.GetStdoutTail())
			printTail(w, "stderr", a.GetStderrTail())
		}
	}
}

// faultNote says whose fault a failed attempt was (AttemptResult.fault);
// the attempt's error says what failed.
func faultNote(a *apiaryv1.AttemptResult) string {
	switch a.GetFault() {
	case apiaryv1.FailureFault_FAILURE_FAULT_NODE:
		return " (node fault, not charged)"
	case apiaryv1.FailureFault_FAILURE_FAULT_JOB:
		return " (job fault)"
	case apiaryv1.FailureFault_FAILURE_FAULT_UNCONFIRMED:
		return " (unconfirmed: retried on another node to confirm, not charged)"
	}
	return ""
}

func printTail(w io.Writer, name, s string) {
	if s == "" {
		fmt.Fprintf(w, "    [%s: empty]\n", name)
		return
	}
	fmt.Fprintf(w, "    [%s]\n", name)
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		fmt.Fprintf(w, "    %s\n", line)
	}
}

// plural is "1 task", "2 tasks".
func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
