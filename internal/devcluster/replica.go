package devcluster

import (
	"context"
	"fmt"
)

// AddRouter starts another `apiary global` replica named name, with the same
// policy, extra arguments and environment as the first, joined to the same
// WAN pool through the first router (StartRouter does the work). It returns
// the process and its API address once its ready file exists; the caller
// stops it (Proc.Stop). Used by tests that need two router replicas
// (idempotency across routers). With Options.TLS it gets a router
// certificate of its own.
func (c *Cluster) AddRouter(ctx context.Context, name string) (*Proc, string, error) {
	if c.Global == nil {
		return nil, "", fmt.Errorf("devcluster: AddRouter needs a cluster started with a global router")
	}
	var extra []string
	if c.opts.Global.PolicyFile != "" {
		extra = append(extra, "--policy", c.opts.Global.PolicyFile)
	}
	extra = append(extra, c.opts.gossipArgs(name)...)
	return StartRouter(ctx, RouterSpec{Binary: c.opts.Binary, Dir: c.opts.Dir, Name: name, Join: []string{c.GlobalWAN},
		ExtraArgs: append(extra, c.opts.Global.ExtraArgs...), Env: c.opts.gossipEnv(c.opts.ExtraEnv), PKI: c.pki})
}
