package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
)

// orphanRounds bounds how often killOrphans scans /proc: a round that killed
// something is followed by another, to catch a child forked meanwhile.
const orphanRounds = 10

// killOrphans kills every process that a previous run of this agent left
// behind (it was SIGKILLed, so it could not stop its attempts): those
// attempts belong to an epoch that ended with that run, so their work must
// not go on. It reads the attempt records in <DataDir>/attempts, kills the
// processes findOrphans names (group members including children whose
// leader is gone, processes in the work dir, processes carrying this
// agent's environment marker) with SIGKILL, scanning again while a round
// killed something, then removes the records. It runs once, at start-up,
// before this run starts any attempt (no per-attempt cost), and returns how
// many processes it killed.
func killOrphans(dataDir string, log *slog.Logger) int {
	return killOrphansIn("/proc", dataDir, log)
}

// killOrphansIn is killOrphans with /proc at procRoot.
func killOrphansIn(procRoot, dataDir string, log *slog.Logger) int {
	work, err := filepath.Abs(filepath.Join(dataDir, "work"))
	if err != nil {
		return 0
	}
	recDir := filepath.Join(dataDir, "attempts")
	recs := readRecords(recDir)
	s := orphanScan{
		procRoot: procRoot,
		self:     os.Getpid(),
		work:     work + string(filepath.Separator),
		marker:   []byte(agentRunEnv + "=" + agentMarker(dataDir)),
	}
	for _, r := range recs {
		if r.Pgid > 0 {
			s.groups = append(s.groups, r)
		}
	}
	// A killed process may still show in the next round while it exits:
	// each pid is killed and counted once.
	killed := map[int]bool{}
	for range orphanRounds {
		n := 0
		for pid, why := range s.findOrphans() {
			if killed[pid] {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed[pid] = true
				n++
				log.Warn("killed a process left by a previous run of this agent", "pid", pid, "matched", why)
			}
		}
		if n == 0 {
			break
		}
	}
	for name := range recs {
		_ = os.Remove(filepath.Join(recDir, name))
	}
	return len(killed)
}
