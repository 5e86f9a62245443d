package regional_test

// The coordinator's lifecycle in process: a failed start stops every part
// that started (no goroutine, no listener left), Stop waits for every loop,
// and a part that dies later (the etcd member) is reported, naming it.

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/regional"
)

// leakOpts ignores goroutines that outlive any one coordinator by design:
// process-wide ones of libraries (started once, on first use).
var leakOpts = []goleak.Option{
	goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
}

func coordConfig(t *testing.T) regional.Config {
	return regional.Config{ID: "c1", Region: "eu-west", Jurisdiction: "eu", ShardCount: 16,
		APIAddr: testutil.FreeAddr(t), MetricsAddr: testutil.FreeAddr(t),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Etcd: regional.EtcdConfig{DataDir: filepath.Join(t.TempDir(), "etcd"),
			ClientURL: "http://" + testutil.FreeAddr(t), PeerURL: "http://" + testutil.FreeAddr(t)}}
}

// free fails unless every address can be listened on again.
func free(t *testing.T, addrs ...string) {
	t.Helper()
	for _, a := range addrs {
		l, err := net.Listen("tcp", strings.TrimPrefix(a, "http://"))
		if err != nil {
			t.Errorf("%s still taken after the coordinator stopped: %v", a, err)
			continue
		}
		l.Close()
	}
}

func TestFailedStartLeavesNothingBehind(t *testing.T) {
	// serf.Create leaks its query streamer when memberlist cannot bind
	// (serf v0.11.0 starts it before the bind and never stops it): the
	// library's, not ours.
	defer goleak.VerifyNone(t, append(leakOpts, goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("github.com/hashicorp/serf/serf.(*serfQueries).stream"))...)
	cfg := coordConfig(t)
	// The WAN port is taken (TCP and UDP): the last part fails to start,
	// after etcd, metrics, group commit, the API and every loop started.
	cfg.WAN.Bind = testutil.FreeAddr(t)
	tl, err := net.Listen("tcp", cfg.WAN.Bind)
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	ul, err := net.ListenPacket("udp", cfg.WAN.Bind)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	c, err := regional.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = c.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "start wan: wan-bind: start serf on "+cfg.WAN.Bind) {
		t.Fatalf("Start: %v, want the wan part and its address named", err)
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Done not closed after a failed Start")
	}
	free(t, cfg.APIAddr, cfg.MetricsAddr, cfg.Etcd.ClientURL, cfg.Etcd.PeerURL)
}

func TestStopWaitsForEveryLoop(t *testing.T) {
	defer goleak.VerifyNone(t, append(leakOpts, goleak.IgnoreCurrent())...)
	cfg := coordConfig(t)
	cfg.WAN.Bind = testutil.FreeAddr(t)
	cfg.WAN.Join = []string{testutil.FreeAddr(t)} // nobody there: the join loop retries until Stop
	c, err := regional.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "owner", func() error {
		if !c.Owning() {
			return context.DeadlineExceeded
		}
		return nil
	})
	c.Stop()
	if err := c.Err(); err != nil {
		t.Fatalf("a part failed: %v", err)
	}
	free(t, cfg.APIAddr, cfg.MetricsAddr, cfg.Etcd.ClientURL, cfg.Etcd.PeerURL)
}

func TestEtcdDeathFailsTheCoordinator(t *testing.T) {
	cfg := coordConfig(t)
	c, err := regional.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	c.Etcd().Server.HardStop()
	select {
	case <-c.Failed():
	case <-time.After(10 * time.Second):
		t.Fatal("the etcd member stopped, and no part failed within 10 s")
	}
	if err := c.Err(); err == nil || !strings.HasPrefix(err.Error(), "etcd: etcd member c1 stopped serving") {
		t.Fatalf("Err: %v, want the etcd part named", err)
	}
}
