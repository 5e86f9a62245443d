package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// killOrphans kills the process groups of attempts that a previous run of
// this agent left behind (it was SIGKILLed, so it could not stop them). Those
// attempts belong to an epoch that ended with that run, so their work must
// not go on. An attempt runs in its own working dir under <DataDir>/work/ and
// leads its own process group, so a process whose current directory is there
// and which leads its group is such an orphan; the scan of /proc happens once,
// at start-up, before this run starts any attempt (no per-attempt cost). It
// returns how many groups it killed.
func killOrphans(dataDir string, log *slog.Logger) int {
	work, err := filepath.Abs(filepath.Join(dataDir, "work"))
	if err != nil {
		return 0
	}
	work += string(filepath.Separator)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	killed := 0
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 || pid == self {
			continue
		}
		cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
		if err != nil || !strings.HasPrefix(cwd+string(filepath.Separator), work) {
			continue
		}
		if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
			continue // not a group leader: its leader is handled on its own
		}
		if syscall.Kill(-pid, syscall.SIGKILL) == nil {
			killed++
			log.Warn("killed an attempt left by a previous run of this agent", "pgid", pid, "dir", cwd)
		}
	}
	return killed
}
