package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Containment without cgroups (with them, see cgroup.go: an attempt's
// cgroup holds every process it forks, setsid or not, and is killed as a
// whole when the attempt ends; what follows is then the fallback and the
// second net). Every attempt's processes are tracked by
//
//   - its process group (the leader is started with Setpgid), killed as a
//     whole when the leader exits, is timed out or is cancelled (see
//     Execution);
//   - a record on disk, <DataDir>/attempts/<job>.<task>.<attempt>, written
//     before the process is started (without a group yet) and completed once it
//     is (process group id and the leader's start time in clock ticks since
//     boot, from /proc/<pid>/stat), removed once the group was killed;
//   - a marker in its environment, agentRunEnv=<hash of the data dir>, which
//     children inherit even when they leave the group with setsid.
//
// A restarted agent kills every process of a previous run's attempts
// (killOrphans): members of a recorded group that started no earlier than
// the recorded leader (process group ids are reused), processes whose
// current directory is under <DataDir>/work, and processes carrying this
// agent's marker. Without root the marker of another user's process cannot
// be read, and a task that clears its environment and leaves its directory
// and group escapes; cgroups are the cure, where the host has them.

// agentRunEnv is the environment variable that marks a task process as this
// agent's (value: agentMarker of the data dir).
const agentRunEnv = "APIARY_AGENT_RUN"

// agentMarker returns the value of agentRunEnv for an agent with the given
// data dir: 16 hex digits of the SHA-256 of its absolute path, so two agents
// on one host (different data dirs) never sweep each other's tasks, and a
// restarted agent (same data dir) recognises its predecessor's.
func agentMarker(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	sum := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(sum[:8])
}

// attemptRecord is the on-disk record of one running attempt.
type attemptRecord struct {
	// Dir is the attempt's working directory.
	Dir string `json:"dir"`
	// Pgid is the process group id (the leader's pid); 0 while the process
	// is being started.
	Pgid int `json:"pgid,omitempty"`
	// StartTicks is the leader's start time, in clock ticks after boot
	// (field 22 of /proc/<pid>/stat).
	StartTicks uint64 `json:"start_ticks,omitempty"`
	// Cgroups are the attempt's cgroup directories, one per hierarchy (none
	// without cgroups): a restarted agent kills and removes them
	// (containment.sweep) before this record's other scans.
	Cgroups []string `json:"cgroups,omitempty"`
}

// createRecord creates the record at path with rec's Dir as its first line
// and returns it open for appendRecord. The record is written as JSON
// lines that readRecords merges: appending, unlike truncating or renaming
// over a file, does not make ext4 flush it on close (auto_da_alloc), which
// costs milliseconds per attempt.
func createRecord(path string, rec attemptRecord) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o644)
	if err == nil {
		err = appendRecord(f, rec)
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("attempt record: %w", err)
	}
	return f, nil
}

// appendRecord appends rec to f as one JSON line.
func appendRecord(f *os.File, rec attemptRecord) error {
	b, _ := json.Marshal(rec)
	_, err := f.Write(append(b, '\n'))
	return err
}

// writeRecord writes rec to path as a complete record (tests).
func writeRecord(path string, rec attemptRecord) error {
	f, err := createRecord(path, rec)
	if err != nil {
		return err
	}
	return f.Close()
}

// readRecords returns the records in dir, by file name; unreadable or
// malformed records yield a zero record (the directory and marker scans still
// cover them).
func readRecords(dir string) map[string]attemptRecord {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	recs := make(map[string]attemptRecord, len(ents))
	for _, e := range ents {
		// Later lines add fields to earlier ones; a torn last line is
		// skipped.
		var rec attemptRecord
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil {
			for _, line := range bytes.Split(b, []byte{'\n'}) {
				var r attemptRecord
				if json.Unmarshal(line, &r) != nil {
					continue
				}
				if r.Dir != "" {
					rec.Dir = r.Dir
				}
				if r.Pgid > 0 {
					rec.Pgid, rec.StartTicks = r.Pgid, r.StartTicks
				}
				if len(r.Cgroups) > 0 {
					rec.Cgroups = r.Cgroups
				}
			}
		}
		recs[e.Name()] = rec
	}
	return recs
}

// procStat is what killOrphans needs of /proc/<pid>/stat.
type procStat struct {
	state      byte // R, S, D, Z (zombie), ...
	pgid       int
	startTicks uint64
}

// readProcStat parses <procRoot>/<pid>/stat. The command name (field 2) may
// hold spaces and parentheses, so fields are counted from its last ')'.
func readProcStat(procRoot string, pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errors.New("stat: no ')'")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("stat: %d fields after comm, want >= 20", len(f))
	}
	pgid, err1 := strconv.Atoi(f[5-3])
	start, err2 := strconv.ParseUint(f[22-3], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return procStat{}, fmt.Errorf("stat: %w", err)
	}
	return procStat{state: f[0][0], pgid: pgid, startTicks: start}, nil
}

// orphanScan says which processes under procRoot belong to a previous run
// of an agent: see findOrphans.
type orphanScan struct {
	procRoot string
	self     int             // never matched
	work     string          // <DataDir>/work/, absolute, with trailing separator
	marker   []byte          // agentRunEnv=<marker>
	groups   []attemptRecord // recorded groups (Pgid > 0)
}

// findOrphans returns the pids of processes that belong to recorded
// attempts of a previous run, with the reason for each:
//
//   - "group": a member of a recorded process group that started no earlier
//     than the recorded leader. If the process whose pid is the group id is
//     alive with another start time, the id was reused by an unrelated group
//     and none of its members match.
//   - "dir": its current directory is under the work dir.
//   - "marker": its environment carries this agent's marker.
func (s orphanScan) findOrphans() map[int]string {
	ents, err := os.ReadDir(s.procRoot)
	if err != nil {
		return nil
	}
	// Groups whose id now belongs to a different live leader: reused.
	reused := map[int]bool{}
	for _, g := range s.groups {
		if st, err := readProcStat(s.procRoot, g.Pgid); err == nil && st.startTicks != g.StartTicks {
			reused[g.Pgid] = true
		}
	}
	found := map[int]string{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 || pid == s.self {
			continue
		}
		st, err := readProcStat(s.procRoot, pid)
		if err == nil && (st.state == 'Z' || st.state == 'X') {
			continue // dead, waiting to be reaped
		}
		if err == nil {
			for _, g := range s.groups {
				if st.pgid == g.Pgid && !reused[g.Pgid] && st.startTicks >= g.StartTicks {
					found[pid] = "group"
					break
				}
			}
			if found[pid] != "" {
				continue
			}
		}
		dir := filepath.Join(s.procRoot, e.Name())
		if cwd, err := os.Readlink(filepath.Join(dir, "cwd")); err == nil &&
			strings.HasPrefix(cwd+string(filepath.Separator), s.work) {
			found[pid] = "dir"
			continue
		}
		if env, err := os.ReadFile(filepath.Join(dir, "environ")); err == nil && len(s.marker) > 0 {
			for _, kv := range bytes.Split(env, []byte{0}) {
				if bytes.Equal(kv, s.marker) {
					found[pid] = "marker"
					break
				}
			}
		}
	}
	return found
}
