package shards_test

import (
	"context"
	"fmt"
	"log"

	clientv3 "go.etcd.io/etcd/client/v3"

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

// A coordinator campaigns for the shards and, once it owns them, fences every
// write with its term (regional's owner loop does exactly this). Compiled but
// not run: it needs an etcd cluster.
func ExampleElector() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	term, err := shards.NewElector(cli, "/apiary/shards/owner", "coord-1", 2).Campaign(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer term.Resign(ctx)
	// The put commits only while this term still owns the shards.
	resp, err := cli.Txn(ctx).If(term.Fence()).Then(clientv3.OpPut("/apiary/example", "owned")).Commit()
	if err != nil {
		log.Fatal(err)
	}
	if !resp.Succeeded {
		log.Print("fenced: ownership lost")
	}
	<-term.Done() // the term's lease is gone: campaign again
}
