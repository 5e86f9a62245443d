// Package devcluster starts Apiary regions (coordinators and agents) as real
// subprocesses of the apiary binary on loopback, with free ports below the
// ephemeral port range (package ports: 20000-31999) and data dirs under one
// directory, and lets a caller kill, pause, resume and restart any
// of them. `apiary dev`, the integration tests and the load-test harness use
// it. With Options.TLS it also makes every process's certificate (tls.go);
// without, every process runs with --insecure-dev. With Options.ACL the
// regions run with ACLs, bootstrapped through the API, and every agent
// gets a join token (acl.go). It owns process lifecycle (and those files)
// only: it must not touch etcd or job state.
package devcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster/ports"
	"apiary.dev/apiary/internal/pki"
)

// AgentSpec describes one agent process.
type AgentSpec struct {
	ID     string
	Labels map[string]string
	// CPUMillis and MemoryMiB override detection (0: 4000 m and 4096 MiB).
	CPUMillis int64
	MemoryMiB int64
	MaxTasks  int
	// GPUs and GPUModel are passed as --gpus and --gpu-model (0: none).
	GPUs     int32
	GPUModel string
	// ExtraArgs are appended to this agent's `apiary agent` command line
	// (kept across restarts), e.g. --metrics-addr or --fault-file.
	ExtraArgs []string
	// Env is added to this agent's environment after Options.ExtraEnv
	// (kept across restarts); its attempts inherit it (the agent's
	// environment is their base), e.g. a PATH that makes one host bad.
	Env []string
}

// RegionSpec describes one region.
type RegionSpec struct {
	Name         string
	Jurisdiction string
	Labels       map[string]string
	// Coordinators is 1, 3 or 5 (default 1).
	Coordinators int
	Agents       []AgentSpec
	// ExtraArgs are appended to every `apiary region` command line.
	ExtraArgs []string
	// NoLAN runs the region without a serf LAN pool (coordinators without
	// --lan-addr, agents with --lan-addr off): node liveness is the lease
	// alone. By default every coordinator and agent gets a LAN port.
	NoLAN bool
}

// Options configures a cluster.
type Options struct {
	// Binary is the apiary executable.
	Binary string
	// Dir holds data dirs, logs and ready files.
	Dir     string
	Regions []RegionSpec
	// ExtraEnv is added to every process's environment.
	ExtraEnv []string
	// Global, if set, adds a global router (`apiary global`) and makes every
	// coordinator join its serf WAN pool.
	Global *GlobalSpec
	// TLS runs every process with mutual TLS: Start makes a CA and the
	// certificates under <Dir>/tls (PKI): a region certificate per
	// coordinator id, a router certificate, an agent certificate per node
	// id and a client certificate (ClientTLS), passes them as --tls-ca,
	// --tls-cert and --tls-key, and the etcd URLs are https. Without it,
	// every region, router and agent gets --insecure-dev.
	TLS bool
	// ACL runs every region with --acl (needs TLS): Start bootstraps the ACL
	// system once the coordinators serve (through the router when there is
	// one), writes the management token to <Dir>/acl/management.token
	// (ManagementToken), makes one agent join token per agent, bound to its
	// node id, and starts each agent with it (--join-token-file
	// <Dir>/acl/<node-id>.token). Every call the cluster makes (Dial,
	// Region.Dial, the waits) then carries the management token.
	ACL bool
	// GossipKey, when set, is given to every coordinator, router and agent
	// (base64, `apiary keygen`) as $APIARY_GOSSIP_KEY, never on a command
	// line, which every user of the host can read (/proc/<pid>/cmdline):
	// both serf pools are encrypted. Each keeps its keyring file under its
	// data dir (routers: <Dir>/<name>.keyring).
	GossipKey string
}

// EnvGossipKey is the variable that gives a process Options.GossipKey
// (`apiary`'s fallback of --gossip-key, removed from the environment of
// every process that reads it).
const EnvGossipKey = "APIARY_GOSSIP_KEY"

// gossipArgs are the flags of Options.GossipKey: for a router, which has
// no data dir, --gossip-keyring-file; none without a key. The key itself
// goes in the environment (gossipEnv).
func (o *Options) gossipArgs(routerName string) []string {
	if o.GossipKey == "" || routerName == "" {
		return nil
	}
	return []string{"--gossip-keyring-file", filepath.Join(o.Dir, routerName+".keyring")}
}

// gossipEnv is env plus $APIARY_GOSSIP_KEY of Options.GossipKey (env
// itself without a key), in a new slice.
func (o *Options) gossipEnv(env []string) []string {
	env = slices.Clone(env)
	if o.GossipKey == "" {
		return env
	}
	return append(env, EnvGossipKey+"="+o.GossipKey)
}

// GlobalSpec describes the global router process.
type GlobalSpec struct {
	// PolicyFile is passed as --policy to the router and every coordinator
	// (empty: no policy).
	PolicyFile string
	// ExtraArgs are appended to the `apiary global` command line.
	ExtraArgs []string
}

// Proc is one supervised process.
type Proc struct {
	Name    string
	Args    []string
	LogPath string
	env     []string
	bin     string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start (re)starts the process with its original arguments.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !p.exited() {
		return fmt.Errorf("%s is running", p.Name)
	}
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), p.env...)
	// Own process group, and die with the parent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	p.cmd, p.done = cmd, done
	return nil
}

func (p *Proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Pid returns the process id (0 if never started).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process is alive.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !p.exited()
}

func (p *Proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.exited() {
		return fmt.Errorf("%s is not running", p.Name)
	}
	return p.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL (a crash) and waits for the exit.
func (p *Proc) Kill() error {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done
	return nil
}

// DumpStacks sends SIGQUIT, on which a Go process writes every goroutine's
// stack to stderr (its log) and exits, and waits up to timeout for the
// exit. For tests that failed: where each process was stuck.
func (p *Proc) DumpStacks(timeout time.Duration) {
	_ = p.signal(syscall.SIGCONT)
	if err := p.signal(syscall.SIGQUIT); err != nil {
		return
	}
	select {
	case <-p.done:
	case <-time.After(timeout):
	}
}

// Pause sends SIGSTOP (slow, not dead); Resume sends SIGCONT.
func (p *Proc) Pause() error  { return p.signal(syscall.SIGSTOP) }
func (p *Proc) Resume() error { return p.signal(syscall.SIGCONT) }

// Stop sends SIGTERM and waits up to timeout, then SIGKILLs.
func (p *Proc) Stop(timeout time.Duration) {
	if err := p.signal(syscall.SIGTERM); err != nil {
		return
	}
	_ = p.signal(syscall.SIGCONT)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.Kill()
	}
}

// Region is a running region.
type Region struct {
	Spec   RegionSpec
	Coords []*Proc
	// APIAddrs[i] is the gRPC address of Coords[i].
	APIAddrs []string
	// EtcdEndpoints[i] is the etcd client URL of Coords[i]'s member.
	EtcdEndpoints []string
	Agents        []*Proc
	// WANAddrs[i] is the serf WAN address of Coords[i] (with a global router).
	WANAddrs []string
	// LANAddrs[i] is the serf LAN address of Coords[i] (nil with NoLAN).
	LANAddrs []string
	ready    []string
	client   *pki.Reloader // the cluster's client certificate (nil: plaintext)
	token    string        // the management token sent by Dial (Options.ACL)
}

// Addr returns the comma-separated API addresses of the region.
func (r *Region) Addr() string { return strings.Join(r.APIAddrs, ",") }

// Cluster is a set of running regions.
type Cluster struct {
	opts    Options
	Regions []*Region
	// Global is the router process (nil without Options.Global); GlobalAddr
	// its API address and GlobalWAN its serf address.
	Global     *Proc
	GlobalAddr string
	GlobalWAN  string
	wanPorts   [][]int
	globalRdy  string

	// With Options.TLS (tls.go): the CA and certificates, the client
	// certificate's files and its loaded form.
	pki         *PKI
	clientFiles cliconn.TLSFiles
	client      *pki.Reloader

	// With Options.ACL (acl.go): the management token's secret.
	mgmt string
}

// FreePort returns a loopback port that was free a moment ago, below the
// ephemeral port range and reserved against every other picker until this
// process exits (see package ports).
func FreePort() (int, error) {
	ps, err := ports.Pick(1)
	if err != nil {
		return 0, err
	}
	return ps[0], nil
}

// freePorts returns n distinct ports for the processes Start launches; see
// FreePort.
func freePorts(n int) ([]int, error) { return ports.Pick(n) }

// Start launches every region's coordinators (all members of a region at
// once, as etcd needs a quorum to start), waits until each serves, then
// launches the agents and waits until each is registered and READY.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Binary == "" {
		return nil, errors.New("devcluster: Binary is required")
	}
	// Searchable, not listable, by other users: the agents' tasks run as
	// users of their own when the agents run as root (agent.TaskUsersAuto)
	// and must reach their work dirs under it; the secrets under it are in
	// 0700 directories (tls, acl) or 0600 files.
	if err := os.MkdirAll(opts.Dir, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(opts.Dir, 0o711); err != nil {
		return nil, err
	}
	if err := opts.checkACL(); err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts}
	if err := c.setupTLS(); err != nil {
		return nil, err
	}
	if opts.Global != nil {
		if err := c.startGlobal(); err != nil {
			return nil, err
		}
	}
	for _, rs := range opts.Regions {
		r, err := c.startRegion(rs)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Regions = append(c.Regions, r)
	}
	for _, r := range c.Regions {
		if err := r.WaitCoordinators(ctx); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if opts.ACL {
		if err := c.bootstrapACL(ctx); err != nil {
			c.Stop()
			return nil, err
		}
	}
	for _, r := range c.Regions {
		for i := range r.Spec.Agents {
			if err := r.startAgent(ctx, c, i); err != nil {
				c.Stop()
				return nil, err
			}
		}
	}
	for _, r := range c.Regions {
		if err := r.WaitNodes(ctx, len(r.Spec.Agents)); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if c.Global != nil {
		if err := c.WaitGlobal(ctx); err != nil {
			c.Stop()
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) startRegion(rs RegionSpec) (*Region, error) {
	if rs.Coordinators == 0 {
		rs.Coordinators = 1
	}
	n := rs.Coordinators
	ports, err := freePorts(3 * n)
	if err != nil {
		return nil, err
	}
	r := &Region{Spec: rs, client: c.client}
	scheme := "http"
	if c.pki != nil {
		scheme = "https"
	}
	var lanPorts []int
	if !rs.NoLAN {
		if lanPorts, err = freePorts(n); err != nil {
			return nil, err
		}
	}
	var initial []string
	for i := 0; i < n; i++ {
		initial = append(initial, fmt.Sprintf("%s-c%d=%s://127.0.0.1:%d", rs.Name, i+1, scheme, ports[3*i+1]))
	}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("%s-c%d", rs.Name, i+1)
		api := fmt.Sprintf("127.0.0.1:%d", ports[3*i+2])
		ready := filepath.Join(c.opts.Dir, id+".ready")
		_ = os.Remove(ready)
		args := []string{"region", "--id", id, "--region", rs.Name, "--jurisdiction", rs.Jurisdiction,
			"--data-dir", filepath.Join(c.opts.Dir, id),
			"--listen", api,
			"--etcd-client-url", fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[3*i]),
			"--etcd-peer-url", fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[3*i+1]),
			"--initial-cluster", strings.Join(initial, ","),
			"--ready-file", ready}
		targs, err := tlsArgs(c.pki, pki.RoleRegion, rs.Name, id)
		if err != nil {
			return nil, err
		}
		args = append(args, targs...)
		args = append(args, c.opts.aclArgs()...)
		for k, v := range rs.Labels {
			args = append(args, "--label", k+"="+v)
		}
		if c.opts.Global != nil {
			args = append(args, c.wanArgs(len(c.Regions), i)...)
			r.WANAddrs = append(r.WANAddrs, fmt.Sprintf("127.0.0.1:%d", c.wanPorts[len(c.Regions)][i]))
		}
		if lanPorts != nil {
			r.LANAddrs = append(r.LANAddrs, fmt.Sprintf("127.0.0.1:%d", lanPorts[i]))
			args = append(args, "--lan-addr", r.LANAddrs[i])
		}
		args = append(args, rs.ExtraArgs...)
		p := &Proc{Name: id, Args: args, LogPath: filepath.Join(c.opts.Dir, id+".log"), env: c.opts.gossipEnv(c.opts.ExtraEnv), bin: c.opts.Binary}
		if err := p.Start(); err != nil {
			return nil, err
		}
		r.Coords = append(r.Coords, p)
		r.APIAddrs = append(r.APIAddrs, api)
		r.EtcdEndpoints = append(r.EtcdEndpoints, fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[3*i]))
		r.ready = append(r.ready, ready)
	}
	return r, nil
}

// WaitCoordinators waits until every running coordinator of the region has
// written its ready file and answers GetRegionInfo.
func (r *Region) WaitCoordinators(ctx context.Context) error {
	for i, p := range r.Coords {
		if !p.Running() {
			continue
		}
		if err := waitFor(ctx, 60*time.Second, func() error {
			if !p.Running() {
				return fmt.Errorf("%s exited; see %s", p.Name, p.LogPath)
			}
			if _, err := os.Stat(r.ready[i]); err != nil {
				return err
			}
			return nil
		}); err != nil {
			return fmt.Errorf("coordinator %s not ready: %w", p.Name, err)
		}
	}
	return nil
}

// RestartCoordinator starts a stopped coordinator again (same data dir and
// ports) and waits until it serves.
func (r *Region) RestartCoordinator(ctx context.Context, i int) error {
	_ = os.Remove(r.ready[i])
	if err := r.Coords[i].Start(); err != nil {
		return err
	}
	return waitFor(ctx, 60*time.Second, func() error {
		if !r.Coords[i].Running() {
			return fmt.Errorf("%s exited; see %s", r.Coords[i].Name, r.Coords[i].LogPath)
		}
		_, err := os.Stat(r.ready[i])
		return err
	})
}

// Agent returns the region's agent process with node id, or nil.
func (r *Region) Agent(id string) *Proc {
	for _, p := range r.Agents {
		if p.Name == id {
			return p
		}
	}
	return nil
}

// RestartCoordinators starts every stopped coordinator of the region at
// once (a region whose members were all down needs a quorum before any of
// them is ready) and waits until all serve.
func (r *Region) RestartCoordinators(ctx context.Context) error {
	for i, p := range r.Coords {
		if p.Running() {
			continue
		}
		_ = os.Remove(r.ready[i])
		if err := p.Start(); err != nil {
			return err
		}
	}
	return r.WaitCoordinators(ctx)
}

func (r *Region) startAgent(ctx context.Context, c *Cluster, i int) error {
	as := r.Spec.Agents[i]
	if as.CPUMillis == 0 {
		as.CPUMillis = 4000
	}
	if as.MemoryMiB == 0 {
		as.MemoryMiB = 4096
	}
	args := []string{"agent", "--addr", r.Addr(), "--node-id", as.ID,
		"--data-dir", filepath.Join(c.opts.Dir, as.ID),
		"--cpu-millis", strconv.FormatInt(as.CPUMillis, 10), "--memory-mb", strconv.FormatInt(as.MemoryMiB, 10),
		"--max-tasks", strconv.Itoa(as.MaxTasks)}
	if as.GPUs > 0 {
		args = append(args, "--gpus", strconv.Itoa(int(as.GPUs)))
	}
	if as.GPUModel != "" {
		args = append(args, "--gpu-model", as.GPUModel)
	}
	for k, v := range as.Labels {
		args = append(args, "--label", k+"="+v)
	}
	targs, err := tlsArgs(c.pki, pki.RoleAgent, r.Spec.Name, as.ID)
	if err != nil {
		return err
	}
	args = append(args, targs...)
	if c.opts.ACL {
		file, err := c.agentToken(ctx, r, as.ID)
		if err != nil {
			return err
		}
		args = append(args, "--join-token-file", file)
	}
	lanAddr := "off"
	if !r.Spec.NoLAN {
		port, err := FreePort()
		if err != nil {
			return err
		}
		lanAddr = fmt.Sprintf("127.0.0.1:%d", port) // kept across restarts
	}
	args = append(args, "--lan-addr", lanAddr)
	args = append(args, as.ExtraArgs...)
	env := append(c.opts.gossipEnv(c.opts.ExtraEnv), as.Env...)
	p := &Proc{Name: as.ID, Args: args, LogPath: filepath.Join(c.opts.Dir, as.ID+".log"), env: env, bin: c.opts.Binary}
	if err := p.Start(); err != nil {
		return err
	}
	r.Agents = append(r.Agents, p)
	return nil
}

// Dial returns a client connection to the region's coordinators (round
// robin over all of them, so a dead one is skipped): with Options.TLS as
// the cluster's client certificate, verifying region.<name>.apiary, else
// plaintext; with Options.ACL every call carries the management token.
func (r *Region) Dial() (*grpc.ClientConn, error) {
	return cliconn.DialTLS(r.Addr(), r.client, r.serverName(), cliconn.WithToken(r.token))
}

// DialWithToken is Dial with secret as the ACL token of every call instead
// of the cluster's management token ("": none).
func (r *Region) DialWithToken(secret string) (*grpc.ClientConn, error) {
	return cliconn.DialTLS(r.Addr(), r.client, r.serverName(), cliconn.WithToken(secret))
}

// serverName is the name the region's coordinators' certificates carry
// ("" without TLS).
func (r *Region) serverName() string {
	if r.client == nil {
		return ""
	}
	return pki.RegionServerName(r.Spec.Name)
}

// WaitNodes waits until at least n nodes are READY in the region.
func (r *Region) WaitNodes(ctx context.Context, n int) error {
	if n == 0 {
		return nil
	}
	conn, err := r.Dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	admin := apiaryv1.NewAdminServiceClient(conn)
	return waitFor(ctx, 60*time.Second, func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := admin.ListNodes(cctx, &apiaryv1.ListNodesRequest{})
		if err != nil {
			return err
		}
		ready := 0
		for _, nd := range resp.GetNodes() {
			if nd.GetStatus() == apiaryv1.NodeStatus_NODE_STATUS_READY {
				ready++
			}
		}
		if ready < n {
			return fmt.Errorf("%d of %d nodes ready in %s", ready, n, r.Spec.Name)
		}
		return nil
	})
}

// Stop stops every process (router, then agents, then coordinators),
// gracefully then by force.
func (c *Cluster) Stop() {
	if c.Global != nil {
		c.Global.Stop(5 * time.Second)
	}
	var wg sync.WaitGroup
	for _, r := range c.Regions {
		for _, p := range r.Agents {
			wg.Add(1)
			go func(p *Proc) { defer wg.Done(); p.Stop(5 * time.Second) }(p)
		}
	}
	wg.Wait()
	for _, r := range c.Regions {
		for _, p := range r.Coords {
			wg.Add(1)
			go func(p *Proc) { defer wg.Done(); p.Stop(10 * time.Second) }(p)
		}
	}
	wg.Wait()
}

// waitFor polls cond every 50 ms until it returns nil, ctx ends or limit
// passes; it returns the last condition error on timeout.
func waitFor(ctx context.Context, limit time.Duration, cond func() error) error {
	deadline := time.Now().Add(limit)
	var last error
	for {
		if last = cond(); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s: %w", limit, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
