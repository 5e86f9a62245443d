package regional

import (
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/regional/store"
)

// putEvent is a watch event putting an assignment of node.
func putEvent(node, job string, index int32, createRev, modRev int64) *clientv3.Event {
	return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(store.KeyAssign(node, job, index)),
		Value: []byte(job), CreateRevision: createRev, ModRevision: modRev}}
}

// TestAssignHubRoutesByNode: the hub refuses subscriptions while no watch
// runs; it hands each put to the subscriptions of its node only, in order,
// and skips deletes; a subscription that falls maxQueuedAssignments behind
// is dropped with errAssignBehind; the watch's end drops every subscription
// with errAssignHubDown and refuses new ones until a watch runs again.
func TestAssignHubRoutesByNode(t *testing.T) {
	h := newAssignHub()
	if _, err := h.subscribe("n1"); !errors.Is(err, errAssignHubDown) {
		t.Fatalf("subscribe before a watch runs: %v, want errAssignHubDown", err)
	}
	h.setWatching(true, nil)
	a, err := h.subscribe("n1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := h.subscribe("n1")
	other, _ := h.subscribe("n10") // a node id that n1 is a prefix of
	h.deliver(clientv3.WatchResponse{Events: []*clientv3.Event{
		putEvent("n1", "j", 0, 5, 5),
		putEvent("n10", "j", 1, 6, 6),
		{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(store.KeyAssign("n1", "j", 2)), ModRevision: 7}},
		putEvent("n1", "j", 0, 5, 8), // rewritten (a cancel): same fencing token
	}})
	for name, s := range map[string]*assignSub{"a": a, "b": b} {
		select {
		case <-s.ready:
		default:
			t.Fatalf("subscription %s not signalled", name)
		}
		evs, dropped := s.take()
		if dropped != nil || len(evs) != 2 || evs[0].modRev != 5 || evs[1].modRev != 8 || evs[1].createRev != 5 {
			t.Fatalf("subscription %s of n1 got %+v (dropped %v), want the puts at 5 and 8", name, evs, dropped)
		}
	}
	if evs, _ := other.take(); len(evs) != 1 || evs[0].modRev != 6 {
		t.Fatalf("subscription of n10 got %+v, want its put at 6", evs)
	}

	h.unsubscribe(b)
	var flood []*clientv3.Event
	for i := range maxQueuedAssignments + 1 {
		flood = append(flood, putEvent("n1", "j", int32(i), int64(10+i), int64(10+i)))
	}
	h.deliver(clientv3.WatchResponse{Events: flood})
	if evs, dropped := a.take(); !errors.Is(dropped, errAssignBehind) || len(evs) != 0 {
		t.Fatalf("a subscription %d events behind: %d queued, dropped %v; want dropped with errAssignBehind",
			maxQueuedAssignments+1, len(evs), dropped)
	}
	if evs, _ := b.take(); len(evs) != 0 {
		t.Fatalf("an unsubscribed stream got %d events", len(evs))
	}

	h.setWatching(false, errAssignHubDown)
	if _, dropped := other.take(); !errors.Is(dropped, errAssignHubDown) {
		t.Fatalf("subscription after the watch ended: dropped %v, want errAssignHubDown", dropped)
	}
	if _, err := h.subscribe("n1"); !errors.Is(err, errAssignHubDown) {
		t.Fatalf("subscribe after the watch ended: %v, want errAssignHubDown", err)
	}
}

func TestAssignNode(t *testing.T) {
	for key, want := range map[string]string{
		store.KeyAssign("edge-7", "j", 3): "edge-7",
		store.PrefAssign + "n1":           "",
		store.PrefAssign + "/j/000001":    "",
		store.KeyNodeAlive("n1"):          "",
	} {
		got, ok := assignNode(key)
		if got != want || ok != (want != "") {
			t.Errorf("assignNode(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
}
