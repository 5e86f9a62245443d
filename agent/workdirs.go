package agent

import (
	"context"
	"os"
	"path/filepath"
	"time"
)

// Finished attempts' directories under DataDir/work/<job>/<task>/<attempt>
// hold the working dir and the full stdout/stderr logs (the coordinator keeps
// only the tails). An agent on a long-lived host would fill its disk with
// them, so they are removed WorkRetention after their last change, unless
// the attempt is running.

// janitor sweeps the work dirs every retention/4 (between 1 s and 10 min)
// until ctx ends. A negative WorkRetention turns it off.
func (a *Agent) janitor(ctx context.Context) {
	r := a.cfg.WorkRetention
	if r < 0 {
		return
	}
	every := min(max(r/4, time.Second), 10*time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n := a.sweepWorkDirs(now); n > 0 {
				a.log.Info("removed finished attempts' work dirs", "count", n, "retention", r)
			}
		}
	}
}

// sweepWorkDirs removes every attempt directory that is not running and in
// which nothing (the directory or a file directly in it) changed for
// WorkRetention before now, then the task and job directories left empty.
// It returns how many attempt directories it removed. Errors (a directory
// vanishing, permissions) skip the entry; the next sweep tries again.
func (a *Agent) sweepWorkDirs(now time.Time) int {
	running := map[string]bool{}
	a.mu.Lock()
	for k, st := range a.seen {
		if st.finished.IsZero() {
			if d, err := a.workDir(k); err == nil {
				running[d] = true
			}
		}
	}
	a.mu.Unlock()
	cutoff := now.Add(-a.cfg.WorkRetention)
	root := filepath.Join(a.cfg.DataDir, "work")
	removed := 0
	jobs, _ := os.ReadDir(root)
	for _, j := range jobs {
		if !j.IsDir() {
			continue
		}
		jdir := filepath.Join(root, j.Name())
		tasks, _ := os.ReadDir(jdir)
		for _, tk := range tasks {
			if !tk.IsDir() {
				continue
			}
			tdir := filepath.Join(jdir, tk.Name())
			atts, _ := os.ReadDir(tdir)
			for _, at := range atts {
				adir := filepath.Join(tdir, at.Name())
				if !at.IsDir() || running[adir] || changedSince(adir, cutoff) {
					continue
				}
				if os.RemoveAll(adir) == nil {
					removed++
				}
			}
			_ = os.Remove(tdir) // only if empty
		}
		_ = os.Remove(jdir) // only if empty
	}
	return removed
}

// changedSince reports whether dir or a file directly in it was modified
// after t (an unreadable entry counts as changed: it is kept).
func changedSince(dir string, t time.Time) bool {
	st, err := os.Stat(dir)
	if err != nil || st.ModTime().After(t) {
		return true
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return true
	}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || info.ModTime().After(t) {
			return true
		}
	}
	return false
}
