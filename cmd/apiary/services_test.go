package main

// The processes' lifecycle, run as a user runs them: `apiary region` and
// `apiary global` start their parts in order, stop them in reverse on
// SIGTERM and exit 0; a part that fails to start stops the process with a
// non-zero exit naming the part; and a coordinator keeps joining the WAN
// pool for as long as it runs (issue 18: it used to stop 60 s after start,
// with its start-up context).

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

var partLine = regexp.MustCompile(`msg="part (running|stopped)" part=(\S+)`)

// partEvents returns the parts in the order the log says they ran, and
// the order they stopped.
func partEvents(log string) (running, stopped []string) {
	for _, m := range partLine.FindAllStringSubmatch(log, -1) {
		if m[1] == "running" {
			running = append(running, m[2])
		} else {
			stopped = append(stopped, m[2])
		}
	}
	return running, stopped
}

// proc is a process of the built binary with its stderr captured.
type proc struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan error
}

func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(testutil.Binary(t), args...), done: make(chan error, 1)}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
	})
	return p
}

// exit waits up to limit for the process to end and returns its exit code.
func (p *proc) exit(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		if err == nil {
			return 0
		}
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		t.Fatalf("wait: %v", err)
	case <-time.After(limit):
		t.Fatalf("process did not exit within %s; output:\n%s", limit, p.out.String())
	}
	return -1
}

func waitFile(t *testing.T, p *proc, path string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, "ready file "+path, func() error {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("process exited (%v):\n%s", err, p.out.String())
		default:
		}
		b, err := os.ReadFile(path)
		if err == nil && len(b) == 0 {
			return fmt.Errorf("empty")
		}
		return err
	})
}

func regionArgs(t *testing.T, dir string, extra ...string) []string {
	return append([]string{"region", "--insecure-dev", "--id", "c1", "--region", "eu-west", "--jurisdiction", "eu", "--shards", "16",
		"--data-dir", filepath.Join(dir, "etcd"), "--listen", testutil.FreeAddr(t),
		"--etcd-client-url", "http://" + testutil.FreeAddr(t), "--etcd-peer-url", "http://" + testutil.FreeAddr(t),
		"--metrics-addr", testutil.FreeAddr(t)}, extra...)
}

func TestRegionStartsPartsInOrderStopsInReverse(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	p := startProc(t, regionArgs(t, dir, "--ready-file", ready, "--lan-addr", "127.0.0.1:0",
		"--wan-bind", testutil.FreeAddr(t), "--wan-join", testutil.FreeAddr(t))...)
	waitFile(t, p, ready)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.exit(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0; output:\n%s", code, p.out.String())
	}
	running, stopped := partEvents(p.out.String())
	want := []string{"etcd", "metrics", "group-commit", "assignments", "api", "lan", "members", "capacity", "suspicion", "owner", "wan", "failover", "ready"}
	if !slices.Equal(running, want) {
		t.Fatalf("parts ran in order %v, want %v", running, want)
	}
	slices.Reverse(want)
	if !slices.Equal(stopped, want) {
		t.Fatalf("parts stopped in order %v, want %v; output:\n%s", stopped, want, p.out.String())
	}
}

func TestRegionFailedStartExitsNamingThePart(t *testing.T) {
	dir := t.TempDir()
	// The WAN port is taken (TCP and UDP), as by another process.
	wan := testutil.FreeAddr(t)
	tl, err := net.Listen("tcp", wan)
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	ul, err := net.ListenPacket("udp", wan)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	p := startProc(t, regionArgs(t, dir, "--wan-bind", wan)...)
	if code := p.exit(t, 60*time.Second); code != exitUnavailable {
		t.Fatalf("exit %d, want %d; output:\n%s", code, exitUnavailable, p.out.String())
	}
	out := p.out.String()
	if !strings.Contains(out, `msg="part failed to start; stopped the parts already started" part=wan`) ||
		!strings.Contains(out, "error: start wan: wan-bind: start serf on "+wan) {
		t.Fatalf("no clear line naming the wan part and its port:\n%s", out)
	}
	_, stopped := partEvents(out)
	want := []string{"owner", "suspicion", "capacity", "members", "api", "assignments", "group-commit", "metrics", "etcd"}
	if !slices.Equal(stopped, want) {
		t.Fatalf("after the failed start, parts stopped in order %v, want %v", stopped, want)
	}
}

func TestGlobalStartsPartsInOrderStopsInReverse(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	p := startProc(t, "global", "--insecure-dev", "--name", "g1", "--listen", testutil.FreeAddr(t), "--wan-bind", testutil.FreeAddr(t),
		"--metrics-addr", testutil.FreeAddr(t), "--ready-file", ready)
	waitFile(t, p, ready)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.exit(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0; output:\n%s", code, p.out.String())
	}
	running, stopped := partEvents(p.out.String())
	want := []string{"registry", "serf-metrics", "metrics", "api", "ready"}
	if !slices.Equal(running, want) {
		t.Fatalf("parts ran in order %v, want %v", running, want)
	}
	slices.Reverse(want)
	if !slices.Equal(stopped, want) {
		t.Fatalf("parts stopped in order %v, want %v", stopped, want)
	}
}

// TestRouterStartedLaterSeesRegion: a router started 70 s after a region,
// joining nobody, must see the region, which keeps retrying its --wan-join
// (before the fix the coordinator's join loop ended with its 60 s start-up
// context, and the region stayed invisible).
func TestRouterStartedLaterSeesRegion(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 70 s")
	}
	bin := testutil.Binary(t)
	dir := t.TempDir()
	routerWAN := testutil.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	t0 := time.Now()
	cl, err := devcluster.Start(ctx, devcluster.Options{Binary: bin, Dir: dir, Regions: []devcluster.RegionSpec{{
		Name: "eu-west", Jurisdiction: "eu",
		ExtraArgs: []string{"--wan-bind", testutil.FreeAddr(t), "--wan-join", routerWAN}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Stop()
	// The delay is the scenario (past the coordinator's 60 s start-up
	// bound), not a synchronisation.
	select {
	case <-time.After(time.Until(t0.Add(regionStartTimeout + 10*time.Second))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if !cl.Regions[0].Coords[0].Running() {
		t.Fatalf("coordinator exited; see %s", cl.Regions[0].Coords[0].LogPath)
	}
	router, addr, err := devcluster.StartRouter(ctx, devcluster.RouterSpec{Binary: bin, Dir: dir, Name: "late-router", WANBind: routerWAN})
	if err != nil {
		t.Fatal(err)
	}
	defer router.Stop(10 * time.Second)
	conn, err := cliconn.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := apiaryv1.NewAdminServiceClient(conn)
	testutil.Eventually(t, 20*time.Second, "the late router sees region eu-west up", func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := admin.ListRegions(cctx, &apiaryv1.ListRegionsRequest{})
		if err != nil {
			return err
		}
		for _, r := range resp.GetRegions() {
			if r.GetName() == "eu-west" && r.GetUp() {
				return nil
			}
		}
		return fmt.Errorf("regions: %v", resp.GetRegions())
	})
}

// TestRegionEtcdFatalExitsNamingThePart: an etcd fatal error (here: the data
// directory removed under a running member, which etcd finds at its next
// snapshot purge, within about 30 s) stops the coordinator with exit 3 and a
// line naming the etcd part and etcd's own message. etcd calls zap's Fatal,
// which used to exit 1 without a word (a no-op logger).
func TestRegionEtcdFatalExitsNamingThePart(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	p := startProc(t, regionArgs(t, dir, "--ready-file", ready)...)
	waitFile(t, p, ready)
	if err := os.RemoveAll(filepath.Join(dir, "etcd")); err != nil {
		t.Fatal(err)
	}
	if code := p.exit(t, 90*time.Second); code != exitUnavailable {
		t.Fatalf("exit %d after the data dir vanished, want %d; output:\n%s", code, exitUnavailable, p.out.String())
	}
	out := p.out.String()
	if !regexp.MustCompile(`msg="part failed; stopping the process" .*part=etcd err="etcd fatal: `).MatchString(out) {
		t.Fatalf("no line naming the etcd part and etcd's fatal message:\n%s", out)
	}
}
