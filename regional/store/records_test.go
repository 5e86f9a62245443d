package store

import (
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

func TestMustJSONDoesNotEscapeHTML(t *testing.T) {
	if got := MustJSON(map[string]string{"out": "<a>&"}); got != `{"out":"<a>&"}` {
		t.Fatalf("MustJSON = %s", got)
	}
}

// TestNodeViewDatasets: a node holds its record's datasets and the outputs
// of its current epoch recorded after the record was written; a record
// written later (the agent's next scan) supersedes an output (deleted from
// disk: gone), and outputs of another epoch never count.
func TestNodeViewDatasets(t *testing.T) {
	rec := func(rev int64, ds map[string]int64) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(KeyNode("n1")), ModRevision: rev, Value: []byte(MustJSON(NodeRecord{ID: "n1", Epoch: 7, Datasets: ds}))}
	}
	out := func(name string, rev, epoch, bytes int64) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(KeyNodeOutput("n1", name)), ModRevision: rev, Value: []byte(MustJSON(OutputRecord{Epoch: epoch, Bytes: bytes}))}
	}
	var n NodeView
	apply := func(kv *mvccpb.KeyValue) {
		t.Helper()
		_, kind, ok := NodeKeyKind(string(kv.Key))
		if !ok {
			t.Fatalf("%s: not a node key", kv.Key)
		}
		if err := n.Apply(kind, kv, false); err != nil {
			t.Fatal(err)
		}
	}
	apply(rec(10, map[string]int64{"scan": 5}))
	apply(out("table", 11, 7, 50))
	apply(out("old", 12, 6, 9)) // an earlier epoch's
	if got := n.Datasets(); len(got) != 2 || got["scan"] != 5 || got["table"] != 50 {
		t.Fatalf("datasets %v, want scan 5 and table 50", got)
	}
	apply(rec(13, map[string]int64{"scan": 5})) // the agent's next scan: table deleted from disk
	if got := n.Datasets(); len(got) != 1 || got["scan"] != 5 {
		t.Fatalf("after a newer scan without table: %v, want scan only", got)
	}
}
