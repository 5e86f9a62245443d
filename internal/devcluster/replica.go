package devcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// AddRouter starts another `apiary global` replica named name, with the same
// policy and extra arguments as the first, joined to the same WAN pool
// through the first router. It returns the process and its API address once
// its ready file exists; the caller stops it (Proc.Stop). Used by tests that
// need two router replicas (idempotency across routers).
func (c *Cluster) AddRouter(ctx context.Context, name string) (*Proc, string, error) {
	if c.Global == nil {
		return nil, "", fmt.Errorf("devcluster: AddRouter needs a cluster started with a global router")
	}
	ps, err := freePorts(2)
	if err != nil {
		return nil, "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ps[0])
	ready := filepath.Join(c.opts.Dir, name+".ready")
	_ = os.Remove(ready)
	args := []string{"global", "--listen", addr, "--wan-bind", fmt.Sprintf("127.0.0.1:%d", ps[1]), "--name", name,
		"--wan-join", c.GlobalWAN, "--ready-file", ready}
	if c.opts.Global.PolicyFile != "" {
		args = append(args, "--policy", c.opts.Global.PolicyFile)
	}
	args = append(args, c.opts.Global.ExtraArgs...)
	p := &Proc{Name: name, Args: args, LogPath: filepath.Join(c.opts.Dir, name+".log"), env: c.opts.ExtraEnv, bin: c.opts.Binary}
	if err := p.Start(); err != nil {
		return nil, "", err
	}
	if err := waitFor(ctx, 60*time.Second, func() error {
		if !p.Running() {
			return fmt.Errorf("%s exited; see %s", name, p.LogPath)
		}
		_, err := os.Stat(ready)
		return err
	}); err != nil {
		p.Kill()
		return nil, "", fmt.Errorf("router %s not ready: %w", name, err)
	}
	return p, addr, nil
}
