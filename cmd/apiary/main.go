// Command apiary is Apiary's one binary; every role is a subcommand
// (region, agent, job, node, placement, dev, ...).
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// Exit codes shared by every client subcommand.
const (
	exitOK          = 0
	exitJobFailed   = 1
	exitInvalid     = 2
	exitUnavailable = 3
	// exitWaitTimeout: `job run --wait` stopped at --wait-timeout; the job
	// keeps running.
	exitWaitTimeout = 4
)

// exitError carries a process exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// withCode wraps err so main exits with code.
func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: code, err: err}
}

// subcommands is filled by each file's init via register, so that every role
// lives in its own file.
var subcommands []func() *cobra.Command

func register(f func() *cobra.Command) { subcommands = append(subcommands, f) }

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "apiary",
		Short:         "Apiary: a sharded, multi-region job control plane",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, f := range subcommands {
		root.AddCommand(f())
	}
	return root
}

func main() {
	root := newRootCmd()
	if err := root.Execute(); err != nil {
		code := exitInvalid
		var ee *exitError
		if e, ok := err.(*exitError); ok {
			ee = e
			code = ee.code
		}
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(code)
	}
}
