package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// pgidFileName is written into an attempt's working dir while its process
// group runs.
const pgidFileName = "pgid"

// killOrphans kills the process groups of attempts that a previous run of
// this agent left behind (it was SIGKILLed, so it could not stop them). Those
// attempts belong to an epoch that ended with that run, so their work must
// not go on. A group is killed only if its leader still runs in the attempt's
// working dir, so a recycled pid is never hit. It returns how many it killed.
func killOrphans(dataDir string, log *slog.Logger) int {
	files, _ := filepath.Glob(filepath.Join(dataDir, "work", "*", "*", "*", pgidFileName))
	killed := 0
	for _, f := range files {
		dir := filepath.Dir(f)
		b, err := os.ReadFile(f)
		_ = os.Remove(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 1 {
			continue
		}
		cwd, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd")
		if err != nil {
			continue
		}
		abs, _ := filepath.Abs(dir)
		if filepath.Clean(cwd) != filepath.Clean(abs) {
			continue
		}
		if syscall.Kill(-pid, syscall.SIGKILL) == nil {
			killed++
			log.Warn("killed an attempt left by a previous run of this agent", "pgid", pid, "dir", dir)
		}
	}
	return killed
}
