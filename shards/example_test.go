package shards_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"apiary.dev/apiary/shards"
)

// Of maps a job id to its shard; the same id always lands on the same shard
// of a region (its shard count is fixed when the region is created).
func ExampleOf() {
	id := "eu-west-01hzzz0000000000000000000"
	s := shards.Of(id, shards.DefaultCount)
	fmt.Println(s >= 0 && s < shards.DefaultCount, s == shards.Of(id, shards.DefaultCount))
	fmt.Println(shards.Of(id, 1))
	// Output:
	// true true
	// 0
}

// Validate names the rule a bad shard count breaks.
func ExampleValidate() {
	fmt.Println(shards.Validate(shards.DefaultCount))
	fmt.Println(shards.Validate(0))
	// Output:
	// <nil>
	// shard count: must be in 1..65536, got 0
}

// Each coordinator runs a Reconciler under its session lease, fed the live
// member set; OnChange starts and stops per-shard work, and every write for
// shard s is fenced on its epoch. Compiled but not run: it needs an etcd
// cluster.
func ExampleReconciler() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(2))
	if err != nil {
		log.Fatal(err)
	}
	members := make(chan []string, 1)
	members <- []string{"coord-1", "coord-2", "coord-3"} // from /apiary/members/ or serf
	layout := shards.Layout{Prefix: shards.DefaultPrefix, Count: shards.DefaultCount}
	r, err := shards.NewReconciler(shards.ReconcilerConfig{
		Client: cli, Layout: layout, ID: "coord-1",
		Lease: sess.Lease(), LeaseDone: sess.Done(), Members: members,
		HandBack: func(ctx context.Context, s int) error { return nil }, // stop shard s's loop, finish its plan
		OnChange: func(owned map[int]shards.Epoch) { fmt.Println("own", len(owned), "shards") },
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		for s, e := range r.Owned() {
			// A plan for shard s commits only while this member owns it.
			_, _ = cli.Txn(context.Background()).If(layout.Fence(s, e)).Then(clientv3.OpPut("/apiary/example", "planned")).Commit()
		}
	}()
	if err := r.Run(context.Background()); errors.Is(err, shards.ErrLeaseGone) {
		log.Print("lease gone: start again with a new session")
	}
}
