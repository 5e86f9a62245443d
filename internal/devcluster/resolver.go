package devcluster

import (
	"strings"

	"google.golang.org/grpc/resolver"
)

// staticBuilder resolves "static:///a:1,b:2" to those addresses, so a client
// round-robins over a region's coordinators and skips dead ones.
type staticBuilder struct{}

func (staticBuilder) Scheme() string { return "static" }

func (staticBuilder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	var addrs []resolver.Address
	for _, a := range strings.Split(t.Endpoint(), ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, resolver.Address{Addr: a})
		}
	}
	err := cc.UpdateState(resolver.State{Addresses: addrs})
	return nopResolver{}, err
}

type nopResolver struct{}

func (nopResolver) ResolveNow(resolver.ResolveNowOptions) {}
func (nopResolver) Close()                                {}
