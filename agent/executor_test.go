package agent

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

func spec(t *testing.T, script string) Spec {
	return Spec{
		Command:   "sh",
		Args:      []string{"-c", script},
		Env:       os.Environ(),
		Dir:       filepath.Join(t.TempDir(), "work", "j", "0", "1"),
		TailBytes: 1024,
		KillGrace: 2 * time.Second,
	}
}

func TestExecutorExitCodeAndLogs(t *testing.T) {
	s := spec(t, "echo out; echo err >&2; exit 3")
	e, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	res := e.Wait()
	if res.Outcome != OutcomeExited || res.ExitCode != 3 || res.Err != nil {
		t.Fatalf("result %+v, want exited 3", res)
	}
	if res.StdoutTail != "out\n" || res.StderrTail != "err\n" {
		t.Fatalf("tails %q %q", res.StdoutTail, res.StderrTail)
	}
	if b, _ := os.ReadFile(filepath.Join(s.Dir, "stdout.log")); string(b) != "out\n" {
		t.Fatalf("stdout.log %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(s.Dir, "stderr.log")); string(b) != "err\n" {
		t.Fatalf("stderr.log %q", b)
	}
	if res.Started.IsZero() || res.Ended.Before(res.Started) {
		t.Fatalf("times %v %v", res.Started, res.Ended)
	}
}

func TestExecutorWorkingDirAndEnv(t *testing.T) {
	s := spec(t, `pwd; echo "$FOO"`)
	s.Env = append(s.Env, "FOO=bar")
	e, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	res := e.Wait()
	want := s.Dir + "\nbar\n"
	if res.StdoutTail != want {
		t.Fatalf("stdout %q, want %q", res.StdoutTail, want)
	}
}

func TestExecutorTailKeepsLastBytes(t *testing.T) {
	s := spec(t, `i=0; while [ $i -lt 2000 ]; do printf 0123456789; i=$((i+1)); done; printf END`)
	s.TailBytes = 100
	e, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	res := e.Wait()
	if len(res.StdoutTail) != 100 || !strings.HasSuffix(res.StdoutTail, "789END") {
		t.Fatalf("tail (%d bytes) %q", len(res.StdoutTail), res.StdoutTail)
	}
	st, err := os.Stat(filepath.Join(s.Dir, "stdout.log"))
	if err != nil || st.Size() != 20003 {
		t.Fatalf("full log size %v, %v; want 20003", st, err)
	}
}

func TestExecutorTimeoutKillsProcessGroup(t *testing.T) {
	s := spec(t, `sleep 100 & echo $! > grandchild; echo $$ > self; sleep 100`)
	s.Timeout = 300 * time.Millisecond
	start := time.Now()
	e, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	gc := readPids(t, filepath.Join(s.Dir, "grandchild"), 1)[0]
	res := e.Wait()
	if res.Outcome != OutcomeTimedOut || res.ExitCode != -1 {
		t.Fatalf("result %+v, want timed out, -1", res)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
	waitFor(t, 5*time.Second, func() bool { return processGone(gc) && processGone(e.Pid()) },
		"grandchild %d and leader %d to be gone", gc, e.Pid())
}

func TestExecutorKillGraceEscalatesToSIGKILL(t *testing.T) {
	s := spec(t, `trap '' TERM; echo ready; while :; do sleep 0.05; done`)
	s.KillGrace = 200 * time.Millisecond
	e, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(s.Dir, "stdout.log"))
		return strings.Contains(string(b), "ready")
	}, "ready")
	e.Cancel()
	res := e.Wait()
	if res.Outcome != OutcomeCancelled || res.ExitCode != -1 {
		t.Fatalf("result %+v", res)
	}
}

func TestExecutorCancelKills(t *testing.T) {
	s := spec(t, `sleep 100 & echo $! > grandchild; sleep 100`)
	e, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	gc := readPids(t, filepath.Join(s.Dir, "grandchild"), 1)[0]
	e.Cancel()
	e.Cancel() // idempotent
	res := e.Wait()
	if res.Outcome != OutcomeCancelled || res.ExitCode != -1 {
		t.Fatalf("result %+v", res)
	}
	waitFor(t, 5*time.Second, func() bool { return processGone(gc) }, "grandchild gone")
}

func TestExecutorLeftoversKilledAfterExit(t *testing.T) {
	// The leader exits at once; its background child must not outlive the
	// attempt, nor hold the result back by keeping the log pipes open.
	s := spec(t, `sleep 100 & echo $! > grandchild; exit 0`)
	e, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	res := e.Wait()
	if res.Outcome != OutcomeExited || res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}
	gc := readPids(t, filepath.Join(s.Dir, "grandchild"), 1)[0]
	waitFor(t, 5*time.Second, func() bool { return processGone(gc) }, "grandchild gone")
}

func TestExecutorCommandNotFound(t *testing.T) {
	s := spec(t, "")
	s.Command, s.Args = "apiary-no-such-command-xyz", nil
	if _, err := Start(s); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("err %v, want not found", err)
	}
	s.Command = "/nonexistent/bin/x"
	if _, err := Start(s); err == nil {
		t.Fatal("want error")
	}
}

func TestExecutorStartFaultClassification(t *testing.T) {
	job, node := apiaryv1.FailureFault_FAILURE_FAULT_JOB, apiaryv1.FailureFault_FAILURE_FAULT_NODE
	notExec := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fileParent := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(fileParent, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Spec)
		want apiaryv1.FailureFault
	}{
		{"command not in PATH", func(s *Spec) { s.Command, s.Args = "apiary-no-such-command-xyz", nil }, job},
		{"command path missing", func(s *Spec) { s.Command, s.Args = "/nonexistent/bin/x", nil }, job},
		{"command not executable", func(s *Spec) { s.Command, s.Args = notExec, nil }, job},
		{"command is a directory", func(s *Spec) { s.Command, s.Args = t.TempDir(), nil }, job},
		{"empty command", func(s *Spec) { s.Command = "" }, job},
		{"work dir under a file", func(s *Spec) { s.Dir = filepath.Join(fileParent, "j", "0", "1") }, node},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec(t, "exit 0")
			tc.mod(&s)
			_, err := Start(s)
			var se *StartError
			if !errors.As(err, &se) {
				t.Fatalf("err %v (%T), want a *StartError", err, err)
			}
			if got := StartFault(err); got != tc.want {
				t.Fatalf("err %v: fault %s, want %s", err, got, tc.want)
			}
		})
	}
}

// Fork limits cannot be provoked safely in a test: classify the typed
// errors Cmd.Start returns for them.
func TestClassifyExecErrno(t *testing.T) {
	dir := t.TempDir()
	job, node := apiaryv1.FailureFault_FAILURE_FAULT_JOB, apiaryv1.FailureFault_FAILURE_FAULT_NODE
	pe := func(e syscall.Errno) error { return &os.PathError{Op: "fork/exec", Path: "/bin/x", Err: e} }
	for _, tc := range []struct {
		err  error
		dir  string
		want apiaryv1.FailureFault
	}{
		{pe(syscall.EAGAIN), dir, node},
		{pe(syscall.ENOMEM), dir, node},
		{pe(syscall.EMFILE), dir, node},
		{pe(syscall.ENODEV), dir, node},
		{pe(syscall.ENOENT), dir, job},
		{pe(syscall.EACCES), dir, job},
		{pe(syscall.ENOEXEC), dir, job},
		// The same errno when the work dir is gone: the child's chdir failed.
		{pe(syscall.ENOENT), filepath.Join(dir, "gone"), node},
		{&exec.Error{Name: "x", Err: exec.ErrNotFound}, dir, job},
		{errors.New("opaque"), dir, node},
	} {
		if got := StartFault(classifyExec(tc.err, tc.dir)); got != tc.want {
			t.Errorf("%v (dir %s): fault %s, want %s", tc.err, tc.dir, got, tc.want)
		}
	}
}

func TestTailBuffer(t *testing.T) {
	tb := NewTailBuffer(8)
	tb.Write([]byte("abc"))
	if got := tb.String(); got != "abc" {
		t.Fatal(got)
	}
	tb.Write([]byte("defgh"))
	if got := tb.String(); got != "abcdefgh" {
		t.Fatal(got)
	}
	tb.Write([]byte("ij"))
	if got := tb.String(); got != "cdefghij" {
		t.Fatal(got)
	}
	tb.Write([]byte("0123456789XY"))
	if got := tb.String(); got != "456789XY" {
		t.Fatal(got)
	}
	for i := 0; i < 13; i++ {
		tb.Write([]byte{byte('a' + i)})
	}
	if got := tb.String(); got != "fghijklm" || tb.Total() != 8+2+12+13 {
		t.Fatal(got, tb.Total())
	}
	// A rune cut at the start is dropped; the result is valid UTF-8.
	u := NewTailBuffer(4)
	u.Write([]byte("xé\xffab"))
	if got := u.String(); got != "\uFFFDab" {
		t.Fatalf("%q", got)
	}
	u2 := NewTailBuffer(4)
	u2.Write([]byte("aaé€")) // the last 4 bytes are the tail of é, then €
	if got := u2.String(); got != "€" {
		t.Fatalf("%q", got)
	}
	z := NewTailBuffer(0)
	z.Write([]byte("abc"))
	if z.String() != "" {
		t.Fatal("zero tail kept bytes")
	}
}
