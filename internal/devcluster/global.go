package devcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/pki"
)

// startGlobal picks the router's ports and every coordinator's serf WAN
// port, then starts `apiary global`. The router and the coordinators list
// each other in --wan-join (joins are retried until one answers), so either
// side may start, or restart, first.
func (c *Cluster) startGlobal() error {
	total := 2
	for _, rs := range c.opts.Regions {
		total += max(rs.Coordinators, 1)
	}
	ports, err := freePorts(total)
	if err != nil {
		return err
	}
	c.GlobalAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	c.GlobalWAN = fmt.Sprintf("127.0.0.1:%d", ports[1])
	next := 2
	var coordWANs []string
	for _, rs := range c.opts.Regions {
		var ps []int
		for i := 0; i < max(rs.Coordinators, 1); i++ {
			ps = append(ps, ports[next])
			coordWANs = append(coordWANs, fmt.Sprintf("127.0.0.1:%d", ports[next]))
			next++
		}
		c.wanPorts = append(c.wanPorts, ps)
	}
	c.globalRdy = filepath.Join(c.opts.Dir, "global.ready")
	_ = os.Remove(c.globalRdy)
	args := []string{"global", "--listen", c.GlobalAddr, "--wan-bind", c.GlobalWAN, "--name", "global-1",
		"--wan-join", strings.Join(coordWANs, ","), "--ready-file", c.globalRdy}
	if c.opts.Global.PolicyFile != "" {
		args = append(args, "--policy", c.opts.Global.PolicyFile)
	}
	targs, err := tlsArgs(c.pki, pki.RoleRouter, pki.GlobalRegion, "global-1")
	if err != nil {
		return err
	}
	args = append(args, targs...)
	args = append(args, c.opts.gossipArgs("global-1")...)
	args = append(args, c.opts.Global.ExtraArgs...)
	c.Global = &Proc{Name: "global-1", Args: args, LogPath: filepath.Join(c.opts.Dir, "global-1.log"), env: c.opts.gossipEnv(c.opts.ExtraEnv), bin: c.opts.Binary}
	return c.Global.Start()
}

// wanArgs are the WAN flags of coordinator i of region ri: its own serf
// port, and the router plus every other coordinator to join.
func (c *Cluster) wanArgs(ri, i int) []string {
	own := fmt.Sprintf("127.0.0.1:%d", c.wanPorts[ri][i])
	join := []string{c.GlobalWAN}
	for _, ps := range c.wanPorts {
		for _, p := range ps {
			if a := fmt.Sprintf("127.0.0.1:%d", p); a != own {
				join = append(join, a)
			}
		}
	}
	args := []string{"--wan-bind", own, "--wan-join", strings.Join(join, ",")}
	if c.opts.Global.PolicyFile != "" {
		args = append(args, "--policy", c.opts.Global.PolicyFile)
	}
	return args
}

// WaitGlobal waits until the router serves and sees every region up.
func (c *Cluster) WaitGlobal(ctx context.Context) error {
	if err := waitFor(ctx, 60*time.Second, func() error {
		if !c.Global.Running() {
			return fmt.Errorf("%s exited; see %s", c.Global.Name, c.Global.LogPath)
		}
		_, err := os.Stat(c.globalRdy)
		return err
	}); err != nil {
		return fmt.Errorf("global router not ready: %w", err)
	}
	conn, err := c.Dial(c.GlobalAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	admin := apiaryv1.NewAdminServiceClient(conn)
	return waitFor(ctx, 60*time.Second, func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := admin.ListRegions(cctx, &apiaryv1.ListRegionsRequest{})
		if err != nil {
			return err
		}
		up := map[string]bool{}
		for _, r := range resp.GetRegions() {
			up[r.GetName()] = r.GetUp() && r.GetNodesReady() > 0 || (r.GetUp() && len(c.specOf(r.GetName()).Agents) == 0)
		}
		for _, r := range c.Regions {
			if !up[r.Spec.Name] {
				b, _ := json.Marshal(resp.GetRegions())
				return fmt.Errorf("router does not see region %s up with nodes yet: %s", r.Spec.Name, b)
			}
		}
		return nil
	})
}

func (c *Cluster) specOf(name string) RegionSpec {
	for _, r := range c.Regions {
		if r.Spec.Name == name {
			return r.Spec
		}
	}
	return RegionSpec{}
}
