package devcluster

import (
	"fmt"
	"os"
	"path/filepath"
)

// agentWorkDir is <Options.Dir>/<id>/work, the agent's attempts' work dirs.
func (c *Cluster) agentWorkDir(id string) (string, error) {
	for _, r := range c.Regions {
		for _, as := range r.Spec.Agents {
			if as.ID == id {
				return filepath.Join(c.opts.Dir, id, "work"), nil
			}
		}
	}
	return "", fmt.Errorf("devcluster: no agent %q", id)
}

// BreakWorkDir makes agent id's work dir unusable while the agent runs: it
// replaces <data dir>/work with a regular file, so that every attempt the
// agent is given fails to start on the agent's own path (a node fault) while
// the agent stays READY. Call it once the agent is READY (it creates the
// work dir when it starts). It works as root too (unlike a read-only mode).
func (c *Cluster) BreakWorkDir(id string) error {
	dir, err := c.agentWorkDir(id)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("devcluster: break work dir of %s: %w", id, err)
	}
	if err := os.WriteFile(dir, []byte("broken on purpose by devcluster.BreakWorkDir\n"), 0o644); err != nil {
		return fmt.Errorf("devcluster: break work dir of %s: %w", id, err)
	}
	return nil
}

// RepairWorkDir undoes BreakWorkDir: agent id's work dir is an empty
// directory again.
func (c *Cluster) RepairWorkDir(id string) error {
	dir, err := c.agentWorkDir(id)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("devcluster: repair work dir of %s: %w", id, err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("devcluster: repair work dir of %s: %w", id, err)
	}
	return nil
}
