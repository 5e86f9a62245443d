package regional

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/grafana/dskit/backoff"
	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/regional/store"
)

// Assignment fan-out (the read side of AgentService.StreamAssignments).
// Every assignment stream a coordinator serves needs the puts under its
// node's assignment prefix. One etcd watch per stream made etcd hold as many
// prefix watchers as the coordinator had agents, each event matched against
// all of them, and under a few hundred streams and a thousand assignments a
// second the streams fell seconds behind: placed tasks sat ASSIGNED while
// their agents idled. The hub holds one watch of the whole assignment
// prefix per coordinator and hands each event to the streams of its node,
// as Nomad's servers serve every client's allocation query from one state
// store rather than one query per client.

// maxQueuedAssignments is how many events a stream may fall behind the hub
// before the hub drops it; the stream then ends UNAVAILABLE, and its agent
// reconnects and reads its assignments afresh (as with a lost watch).
const maxQueuedAssignments = 4096

// errAssignHubDown: the hub's watch is not running (starting, or its watch
// ended and is being re-established); the stream should be retried.
var errAssignHubDown = errors.New("assignment watch not running")

// errAssignBehind: the stream fell more than maxQueuedAssignments events
// behind.
var errAssignBehind = errors.New("assignment stream fell behind")

// assignEvent is one put of an assignment key.
type assignEvent struct {
	value []byte
	// createRev is the key's CreateRevision (the fencing token); modRev the
	// revision of this put.
	createRev, modRev int64
}

// assignSub is one stream's subscription: the hub appends its node's events;
// the stream takes them when ready is signalled.
type assignSub struct {
	node  string
	ready chan struct{} // capacity 1: signalled after an append or a drop

	mu      sync.Mutex
	queue   []assignEvent
	dropped error // set once the hub dropped the subscription
}

// take returns the queued events (in revision order) and, once the hub has
// dropped the subscription, why.
func (s *assignSub) take() ([]assignEvent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue
	s.queue = nil
	return q, s.dropped
}

func (s *assignSub) push(ev assignEvent) {
	s.mu.Lock()
	switch {
	case s.dropped != nil:
	case len(s.queue) >= maxQueuedAssignments:
		s.dropped, s.queue = errAssignBehind, nil
	default:
		s.queue = append(s.queue, ev)
	}
	s.mu.Unlock()
	s.signal()
}

func (s *assignSub) drop(err error) {
	s.mu.Lock()
	if s.dropped == nil {
		s.dropped = err
	}
	s.mu.Unlock()
	s.signal()
}

func (s *assignSub) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// assignHub watches store.PrefAssign once and fans its puts out to the
// subscribed streams by node id. Its loop (run) is the coordinator's
// "assignments" part.
type assignHub struct {
	mu       sync.Mutex
	watching bool // a watch is running; subscriptions are served
	subs     map[string]map[*assignSub]bool
}

func newAssignHub() *assignHub { return &assignHub{subs: map[string]map[*assignSub]bool{}} }

// subscribe registers a stream for node's assignment events. Every put
// committed after the hub's last delivered revision reaches the
// subscription, so a read of the node's assignments made after subscribe
// returns misses nothing: events at or below that read's revision are
// duplicates of it (the stream skips them by modRev). It fails with
// errAssignHubDown while no watch runs.
func (h *assignHub) subscribe(node string) (*assignSub, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.watching {
		return nil, errAssignHubDown
	}
	s := &assignSub{node: node, ready: make(chan struct{}, 1)}
	m := h.subs[node]
	if m == nil {
		m = map[*assignSub]bool{}
		h.subs[node] = m
	}
	m[s] = true
	return s, nil
}

func (h *assignHub) unsubscribe(s *assignSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.subs[s.node]; m != nil {
		delete(m, s)
		if len(m) == 0 {
			delete(h.subs, s.node)
		}
	}
}

// deliver hands a watch response's puts to the subscriptions of their
// nodes (deletes carry nothing for an agent: a task's end reaches it as a
// cancel put or by its own report).
func (h *assignHub) deliver(wr clientv3.WatchResponse) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range wr.Events {
		if ev.Type != clientv3.EventTypePut {
			continue
		}
		node, ok := assignNode(string(ev.Kv.Key))
		if !ok {
			continue
		}
		for s := range h.subs[node] {
			s.push(assignEvent{value: ev.Kv.Value, createRev: ev.Kv.CreateRevision, modRev: ev.Kv.ModRevision})
		}
	}
}

// setWatching starts or stops serving subscriptions; stopping drops every
// subscription with err (their streams end and their agents reconnect).
func (h *assignHub) setWatching(on bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watching = on
	if on {
		return
	}
	for node, m := range h.subs {
		for s := range m {
			s.drop(err)
		}
		delete(h.subs, node)
	}
}

// assignNode is the node id in an assignment key (<PrefAssign><node>/<job>/<index>).
func assignNode(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, store.PrefAssign)
	if !ok {
		return "", false
	}
	node, _, ok := strings.Cut(rest, "/")
	if !ok || node == "" {
		return "", false
	}
	return node, true
}

// runAssignHub is the "assignments" part: it keeps the hub's watch running
// until ctx ends, re-establishing it (from a fresh revision, after dropping
// every subscription) whenever it ends, with dskit backoff between tries.
func (c *Coordinator) runAssignHub(ctx context.Context) {
	h := c.assignHub
	b := backoff.New(ctx, backoff.Config{MinBackoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second})
	for b.Ongoing() {
		ran, err := c.watchAssignments(ctx)
		h.setWatching(false, errAssignHubDown)
		if ctx.Err() != nil {
			return
		}
		c.log.Warn("assignment watch ended; streams reconnect", "err", err)
		if ran {
			// A watch that was up ends a separate outage: the wait
			// before the next starts from the minimum again, so streams
			// are not refused for seconds after a later, brief failure.
			b.Reset()
		}
		b.Wait()
	}
}

// watchAssignments runs one watch of the assignment prefix from the current
// revision until it fails or ctx ends. ran reports whether the watch was
// established (the hub served streams) before it ended.
func (c *Coordinator) watchAssignments(ctx context.Context) (ran bool, err error) {
	cctx, cancel := store.EtcdCtx(ctx)
	resp, err := c.cli.Get(cctx, store.PrefAssign, clientv3.WithPrefix(), clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return false, err
	}
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	// c.watchCli, not the in-process c.cli (see its doc).
	w := c.watchCli.Watch(wctx, store.PrefAssign, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	c.assignHub.setWatching(true, nil)
	for wr := range w {
		if err := wr.Err(); err != nil {
			return true, err
		}
		c.assignHub.deliver(wr)
	}
	if ctx.Err() != nil {
		return true, ctx.Err()
	}
	return true, errors.New("watch closed")
}
