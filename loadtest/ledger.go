package loadtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Effect is one ledger line: an attempt of a task that really ran (a start
// line), or that really finished its work (a done line).
type Effect struct {
	JobID        string
	Task         int32
	Attempt      int32
	FencingToken int64
	Node         string
	Region       string
	// Done marks a done line (LedgerDoneCommand): the attempt's work
	// completed, so its effect happened.
	Done bool
}

// LedgerCommand is the shell snippet a load-test task runs first: it appends
// the attempt's identity to the ledger file (one short O_APPEND write, atomic
// on a local file system), then the task's work follows.
func LedgerCommand(ledgerPath string) string {
	return `printf '%s,%s,%s,%s,%s,%s\n' "$APIARY_JOB_ID" "$APIARY_TASK_INDEX" "$APIARY_ATTEMPT" "$APIARY_FENCING_TOKEN" "$APIARY_NODE_ID" "$APIARY_REGION" >> ` + shellQuote(ledgerPath)
}

// LedgerDoneCommand is the shell snippet a task of the liveness scenarios
// runs after its work: the same identity as LedgerCommand plus a seventh
// field "done". A task whose work completed twice has two done lines.
func LedgerDoneCommand(ledgerPath string) string {
	return `printf '%s,%s,%s,%s,%s,%s,done\n' "$APIARY_JOB_ID" "$APIARY_TASK_INDEX" "$APIARY_ATTEMPT" "$APIARY_FENCING_TOKEN" "$APIARY_NODE_ID" "$APIARY_REGION" >> ` + shellQuote(ledgerPath)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// ReadLedger parses a ledger: lines of 6 fields (start) or 7 whose last is
// "start" or "done"; a malformed line is an error naming its number.
func ReadLedger(r io.Reader) ([]Effect, error) {
	var out []Effect
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 6 && len(f) != 7 {
			return nil, fmt.Errorf("ledger line %d: want 6 or 7 fields, got %d: %q", n, len(f), line)
		}
		done := false
		if len(f) == 7 {
			switch f[6] {
			case "start":
			case "done":
				done = true
			default:
				return nil, fmt.Errorf("ledger line %d: field 7 must be start or done, got %q", n, f[6])
			}
		}
		task, err1 := strconv.ParseInt(f[1], 10, 32)
		att, err2 := strconv.ParseInt(f[2], 10, 32)
		tok, err3 := strconv.ParseInt(f[3], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("ledger line %d: task, attempt and token must be integers: %q", n, line)
		}
		out = append(out, Effect{JobID: f[0], Task: int32(task), Attempt: int32(att), FencingToken: tok, Node: f[4], Region: f[5], Done: done})
	}
	return out, sc.Err()
}

// LedgerTask is LedgerCommand and LedgerDoneCommand without a shell, for
// images that hold nothing but the apiary binary (`apiary loadtest task`):
// it appends the attempt's start line to path (identity from getenv:
// APIARY_JOB_ID, APIARY_TASK_INDEX, APIARY_ATTEMPT, APIARY_FENCING_TOKEN,
// APIARY_NODE_ID, APIARY_REGION), sleeps for work, then, with done, appends
// the done line. Each line is one O_APPEND write (atomic on a local file
// system, and across containers that bind-mount one host directory).
func LedgerTask(path string, work time.Duration, done bool, getenv func(string) string) error {
	id := strings.Join([]string{getenv("APIARY_JOB_ID"), getenv("APIARY_TASK_INDEX"), getenv("APIARY_ATTEMPT"),
		getenv("APIARY_FENCING_TOKEN"), getenv("APIARY_NODE_ID"), getenv("APIARY_REGION")}, ",")
	write := func(line string) error {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o666)
		if err != nil {
			return err
		}
		if _, err := f.WriteString(line + "\n"); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if err := write(id); err != nil {
		return err
	}
	time.Sleep(work)
	if done {
		return write(id + ",done")
	}
	return nil
}

// newLedger creates an empty ledger file that every task can append to:
// an agent running as root runs each attempt as a user of its own
// (agent/taskusers.go), which may not create files in the work dir.
func newLedger(path string) error {
	_ = os.Remove(path)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	// The umask took the write bits of group and others.
	if err := os.Chmod(path, 0o666); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	return nil
}
