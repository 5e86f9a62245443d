package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"

	"apiary.dev/apiary/agent"
)

// An agent in-process (as `apiary dev` and the tests run one): New checks the
// configuration, Run registers the node with a coordinator (the one its node id hashes
// to, or the next that answers) and runs its assignments until ctx ends. This example is compiled
// but not run (it needs a coordinator at the address).
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	a, err := agent.New(agent.Config{CoordinatorAddrs: []string{"127.0.0.1:7070"}, DataDir: "/tmp/apiary-agent",
		Capacity: agent.Resources{CPUMillis: 4000, MemoryMB: 8192}})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		epoch, err := a.WaitRegistered(ctx)
		if err == nil {
			log.Printf("node %s registered, epoch %d", a.NodeID(), epoch)
		}
	}()
	// Run returns nil after ctx is cancelled and every process group it
	// started is killed.
	if err := a.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// New refuses an invalid configuration with an error naming the field.
func ExampleNew() {
	_, err := agent.New(agent.Config{NodeID: "n1", Capacity: agent.Resources{CPUMillis: 1000, MemoryMB: 1024}})
	fmt.Println(err)
	// Output: coordinator addrs: at least one address is required
}

// The ledger is the agent's local admission: an attempt runs only if its
// request fits what the node's running attempts leave.
func ExampleLedger() {
	l := agent.NewLedger(agent.Resources{CPUMillis: 2000, MemoryMB: 4096, GPUs: 1}, "", 0)
	first := agent.AttemptKey{JobID: "j1", TaskIndex: 0, Attempt: 1}
	fmt.Println(l.Reserve(first, agent.Request{CPUMillis: 1500, MemoryMB: 1024, GPUMilli: 500}), l.Devices(first))
	err := l.Reserve(agent.AttemptKey{JobID: "j1", TaskIndex: 1, Attempt: 1}, agent.Request{CPUMillis: 1000, MemoryMB: 1024})
	fmt.Println(errors.Is(err, agent.ErrNoRoom))
	l.Release(first)
	used, n := l.Used()
	fmt.Println(used.CPUMillis, n)
	// Output:
	// <nil> [0]
	// true
	// 0 0
}
