package router

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/priority"
)

func TestTagsRoundTripAndLimit(t *testing.T) {
	in := federation.CoordinatorTags{Region: "eu-west", ID: "c1", Jurisdiction: "eu", Labels: map[string]string{"tier": "standard"},
		APIAddr: "127.0.0.1:1", Health: federation.HealthOK, UpdatedMs: 42,
		Capacity: federation.Capacity{Free: federation.Res{CPUMillis: 1, MemoryMiB: 2, GPUs: 3}, Largest: federation.Res{CPUMillis: 4, MemoryMiB: 5, GPUs: 6}, NodesReady: 7},
		Backlog:  []federation.Backlog{{Class: priority.Standard, Pending: 5, Bound: 50}}}
	m, err := in.Encode()
	if err != nil {
		t.Fatal(err)
	}
	out, ok := federation.DecodeCoordinatorTags(m)
	if !ok || out.Capacity != in.Capacity || out.Labels["tier"] != "standard" || out.Backlog[1].Pending != 5 || out.Backlog[0].Pending != -1 {
		t.Fatalf("round trip: %+v", out)
	}
	big := map[string]string{}
	for i := 0; i < 40; i++ {
		big[string(rune('a'+i%26))+string(rune('a'+i/26))] = "0123456789"
	}
	in.Labels = big
	if _, err := in.Encode(); err == nil {
		t.Fatal("tags over 512 bytes accepted")
	}
}

// TestClassifyByTypeNotText: a region's answer that relays another hop's
// "connection refused" was sent (its outcome is unknown, or it is the
// region's refusal); only errors typed as not sent move a submission on.
func TestClassifyByTypeNotText(t *testing.T) {
	ctx := context.Background()
	relayed := status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 10.0.0.9:7070: connect: connection refused\"")
	if got := classify(relayed, ctx); got != outUnknown {
		t.Errorf("UNAVAILABLE with a relayed 'connection refused' text: %v, want outUnknown", got)
	}
	if got := classify(errNoCoordinator, ctx); got != outNotSent {
		t.Errorf("errNoCoordinator: %v, want outNotSent", got)
	}
	if got := classify(&notSentError{status.Error(codes.Unavailable, "error while dialing x")}, ctx); got != outNotSent {
		t.Errorf("notSentError: %v, want outNotSent", got)
	}
	if got := classify(fmt.Errorf("wrapped: %w", errNoCoordinator), ctx); got != outNotSent {
		t.Errorf("wrapped errNoCoordinator: %v, want outNotSent", got)
	}
}
