package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// coordinators is the agent's list of coordinator addresses with one lazy
// gRPC connection each, and the index of the one in use. Every coordinator of
// a region serves AgentService against the same etcd, so an epoch created
// through one is valid through all; moving between them is always safe.
type coordinators struct {
	addrs []string
	conns []*grpc.ClientConn
	// shared: the conns are the caller's (Config.Conns), not closed here.
	shared bool

	mu      sync.Mutex
	cur     int
	changed chan struct{} // closed and replaced on every failover
}

// newCoordinators makes one lazy client connection per address. Its
// reconnect backoff is capped at min(maxBackoff, 1 s) (gRPC's own default
// grows to 120 s, far too slow to notice a restarted coordinator). extra options come
// after the defaults, so they may override them; with none, the transport is
// insecure.
func newCoordinators(addrs []string, minBackoff, maxBackoff time.Duration, extra []grpc.DialOption) (*coordinators, error) {
	opts := []grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{
				// At most a second between reconnects, whatever maxBackoff:
				// after an outage of the region the agent must be back
				// within its lease (plus the etcd leader's extension) to
				// keep its epoch, and a reconnect to loopback or a LAN
				// address is cheap.
				BaseDelay: minBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: min(maxBackoff, time.Second),
			},
			MinConnectTimeout: 2 * time.Second,
		}),
	}
	if len(extra) == 0 {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	opts = append(opts, extra...)
	c := &coordinators{addrs: addrs, changed: make(chan struct{})}
	for _, a := range addrs {
		cc, err := grpc.NewClient(a, opts...)
		if err != nil {
			c.close()
			return nil, fmt.Errorf("coordinator address %q: %w", a, err)
		}
		c.conns = append(c.conns, cc)
	}
	return c, nil
}

// startAt makes the agent begin at the address its node id hashes to
// (xxhash of nodeID modulo the number of addresses) instead of the first,
// so that a fleet given one address list spreads its registrations,
// heartbeats and assignment streams over every coordinator; failover then
// goes round the list from there. Nomad's clients shuffle their server list
// for the same reason. A node keeps its start across restarts.
func (c *coordinators) startAt(nodeID string) *coordinators {
	c.cur = startIndex(nodeID, len(c.addrs))
	return c
}

// startIndex is the index in a list of n addresses that nodeID begins at.
func startIndex(nodeID string, n int) int {
	if n <= 1 {
		return 0
	}
	return int(xxhash.Sum64String(nodeID) % uint64(n))
}

// sharedCoordinators uses conns (Config.Conns, one per address, the
// caller's) instead of dialing; close leaves them open.
func sharedCoordinators(addrs []string, conns []*grpc.ClientConn) *coordinators {
	return &coordinators{addrs: addrs, conns: conns, shared: true, changed: make(chan struct{})}
}

// client returns the coordinator in use and its index, for failover.
func (c *coordinators) client() (int, apiaryv1.AgentServiceClient) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, apiaryv1.NewAgentServiceClient(c.conns[c.cur])
}

// addr returns the address at index i.
func (c *coordinators) addr(i int) string { return c.addrs[i] }

// failover moves to the next address if idx is still the one in use (so
// that several callers failing on the same coordinator move only once).
func (c *coordinators) failover(idx int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == idx && len(c.addrs) > 1 {
		c.cur = (c.cur + 1) % len(c.addrs)
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// watch returns the coordinator in use and a channel closed when it changes.
func (c *coordinators) watch() (int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, c.changed
}

func (c *coordinators) close() {
	if c.shared {
		return
	}
	for _, cc := range c.conns {
		cc.Close()
	}
}

// transient reports whether err is worth retrying (possibly on another
// coordinator): the transport failed or the server was briefly unable to
// answer. Any other error is the server's answer.
func transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted,
		codes.Aborted, codes.Internal, codes.Unknown, codes.Canceled:
		return true
	}
	return false
}
