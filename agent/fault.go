package agent

import (
	"errors"
	"os"
	"os/exec"
	"syscall"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// StartError is the error Start returns when no process was started: the
// cause, and whose fault it is (FAILURE_FAULT_NODE or FAILURE_FAULT_JOB).
type StartError struct {
	Fault apiaryv1.FailureFault
	Err   error
}

func (e *StartError) Error() string { return e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// StartFault returns whose fault a start error is: the Fault of a
// *StartError in err's chain, else FAILURE_FAULT_JOB for exec.ErrNotFound,
// else FAILURE_FAULT_NODE. A nil err is FAILURE_FAULT_UNSPECIFIED.
func StartFault(err error) apiaryv1.FailureFault {
	var se *StartError
	switch {
	case err == nil:
		return apiaryv1.FailureFault_FAILURE_FAULT_UNSPECIFIED
	case errors.As(err, &se):
		return se.Fault
	case errors.Is(err, exec.ErrNotFound):
		return apiaryv1.FailureFault_FAILURE_FAULT_JOB
	}
	return apiaryv1.FailureFault_FAILURE_FAULT_NODE
}

// nodeFault wraps an error of the agent's own paths or resources.
func nodeFault(err error) error {
	return &StartError{Fault: apiaryv1.FailureFault_FAILURE_FAULT_NODE, Err: err}
}

// jobFault wraps an error of the job's command.
func jobFault(err error) error {
	return &StartError{Fault: apiaryv1.FailureFault_FAILURE_FAULT_JOB, Err: err}
}

// classifyExec classifies an error of resolving (exec.Command) or starting
// (Cmd.Start) the command of an attempt whose work dir is dir, by the typed
// error, never its text:
//   - the command is not found or not executable: exec.ErrNotFound or
//     exec.ErrDot, or ENOENT, ENOTDIR, EACCES, EPERM, ENOEXEC, EISDIR,
//     ELOOP or ENAMETOOLONG from the exec (the kernel reports these for the
//     program path, its directories or its #! interpreter) -> JOB, unless the
//     work dir itself is gone (the child's chdir failed) -> NODE;
//   - anything else (EAGAIN and ENOMEM from fork, EMFILE, ENFILE, ENOSPC,
//     EIO, ETXTBSY, ...) -> NODE.
func classifyExec(err error, dir string) error {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, exec.ErrDot) {
		return jobFault(err)
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ENOENT, syscall.ENOTDIR, syscall.EACCES, syscall.EPERM, syscall.ENOEXEC,
			syscall.EISDIR, syscall.ELOOP, syscall.ENAMETOOLONG:
			// The child's chdir into the work dir fails with the same
			// errnos, reported against the program path: tell them apart
			// by whether the work dir is still there.
			if st, serr := os.Stat(dir); serr != nil || !st.IsDir() {
				return nodeFault(err)
			}
			return jobFault(err)
		}
	}
	return nodeFault(err)
}

// faultName is the short lower-case name of f ("node", "job", "").
func faultName(f apiaryv1.FailureFault) string {
	switch f {
	case apiaryv1.FailureFault_FAILURE_FAULT_NODE:
		return "node"
	case apiaryv1.FailureFault_FAILURE_FAULT_JOB:
		return "job"
	}
	return ""
}
