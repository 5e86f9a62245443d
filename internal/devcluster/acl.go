package devcluster

// ACLs of a dev cluster (Options.ACL): every region runs with --acl; once
// the coordinators serve, Start bootstraps the ACL system (through the
// router when there is one, which sends the same token to every region;
// else each region directly, with the same ids), keeps the management
// token, and makes one agent join token per agent, bound to its node id,
// which the agent reads from a file (--join-token-file).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/acl"
)

// ACLDir is the directory under Options.Dir that holds the token files
// (mode 0700): management.token, and <node-id>.token per agent (each 0600,
// the secret alone).
const ACLDir = "acl"

// ManagementToken is the secret of the cluster's management token (""
// without Options.ACL).
func (c *Cluster) ManagementToken() string { return c.mgmt }

// ManagementTokenFile is the path of the file that holds the management
// token's secret (mode 0600; "" without Options.ACL).
func (c *Cluster) ManagementTokenFile() string {
	if c.mgmt == "" {
		return ""
	}
	return filepath.Join(c.opts.Dir, ACLDir, "management.token")
}

// ACL reports whether the cluster runs with ACLs (Options.ACL).
func (c *Cluster) ACL() bool { return c.opts.ACL }

// checkACL refuses Options.ACL without TLS: a token would cross loopback
// in plaintext, and the CLI refuses that only off loopback.
func (o *Options) checkACL() error {
	if o.ACL && !o.TLS {
		return errors.New("devcluster: Options.ACL needs Options.TLS (tokens are sent only over TLS off loopback; a dev cluster with ACLs is run as it would be deployed)")
	}
	return nil
}

// aclArgs are the region flags of Options.ACL.
func (o *Options) aclArgs() []string {
	if !o.ACL {
		return nil
	}
	return []string{"--acl"}
}

// bootstrapACL makes the management token, retried until every region
// took it (a repeat with the same ids is safe: a region that took it
// answers it again), and writes it to ManagementTokenFile.
func (c *Cluster) bootstrapACL(ctx context.Context) error {
	dir := filepath.Join(c.opts.Dir, ACLDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if b, err := os.ReadFile(filepath.Join(dir, "management.token")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		// A cluster started again on the same Dir: its regions were
		// bootstrapped with this token.
		c.setManagement(strings.TrimSpace(string(b)))
		return nil
	}
	req := &apiaryv1.BootstrapACLRequest{AccessorId: acl.NewID(), SecretId: acl.NewID()}
	var names []string
	for _, r := range c.Regions {
		names = append(names, r.Spec.Name)
	}
	slices.Sort(names)
	err := waitFor(ctx, 60*time.Second, func() error {
		took, err := c.eachRegionACL(ctx, nil, func(ctx context.Context, cl apiaryv1.ACLServiceClient) ([]string, error) {
			resp, err := cl.BootstrapACL(ctx, req)
			return resp.GetRegions(), err
		})
		if err != nil {
			return err
		}
		if missing := missingFrom(names, took); len(missing) > 0 {
			return fmt.Errorf("acl bootstrap: not yet taken by %s", strings.Join(missing, ", "))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("acl bootstrap: %w", err)
	}
	c.setManagement(req.GetSecretId())
	return writeSecret(c.ManagementTokenFile(), c.mgmt)
}

// setManagement makes secret the token of every call the cluster makes
// (Cluster.Dial, Region.Dial).
func (c *Cluster) setManagement(secret string) {
	c.mgmt = secret
	for _, r := range c.Regions {
		r.token = secret
	}
}

// agentToken makes the join token of agent id in region r, bound to the
// node id, and returns the file that holds its secret.
func (c *Cluster) agentToken(ctx context.Context, r *Region, id string) (string, error) {
	path := filepath.Join(c.opts.Dir, ACLDir, id+".token")
	if _, err := os.Stat(path); err == nil {
		return path, nil // kept from an earlier start of this agent
	}
	req := &apiaryv1.CreateACLTokenRequest{Name: "dev agent " + id, Type: acl.TypeAgent, Region: r.Spec.Name, NodeId: id,
		AccessorId: acl.NewID(), SecretId: acl.NewID()}
	err := waitFor(ctx, 30*time.Second, func() error {
		_, err := c.eachRegionACL(ctx, r, func(ctx context.Context, cl apiaryv1.ACLServiceClient) ([]string, error) {
			_, err := cl.CreateACLToken(ctx, req)
			return nil, err
		})
		return err
	})
	if err != nil {
		return "", fmt.Errorf("join token of agent %s: %w", id, err)
	}
	return path, writeSecret(path, req.GetSecretId())
}

// eachRegionACL makes one ACLService call through the router (once), or,
// without a router, on every region's coordinators (only on only's when
// set), and returns the regions that took it. With the management token
// once there is one.
func (c *Cluster) eachRegionACL(ctx context.Context, only *Region, call func(ctx context.Context, cl apiaryv1.ACLServiceClient) ([]string, error)) ([]string, error) {
	type target struct {
		region string // "": the router, which names the regions itself
		dial   func() (*grpc.ClientConn, error)
	}
	var targets []target
	if c.Global != nil {
		targets = append(targets, target{"", func() (*grpc.ClientConn, error) { return c.Dial(c.GlobalAddr) }})
	} else {
		for _, r := range c.Regions {
			if only == nil || r == only {
				targets = append(targets, target{r.Spec.Name, r.Dial})
			}
		}
	}
	var took []string
	for _, t := range targets {
		conn, err := t.dial()
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		regions, err := call(cctx, apiaryv1.NewACLServiceClient(conn))
		cancel()
		conn.Close()
		if err != nil {
			return nil, err
		}
		if t.region != "" {
			regions = []string{t.region}
		}
		took = append(took, regions...)
	}
	return took, nil
}

func missingFrom(want, got []string) []string {
	var out []string
	for _, w := range want {
		if !slices.Contains(got, w) {
			out = append(out, w)
		}
	}
	return out
}

// writeSecret writes a token's secret alone to path, mode 0600.
func writeSecret(path, secret string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(secret+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
