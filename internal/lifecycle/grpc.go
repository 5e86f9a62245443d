package lifecycle

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/grafana/dskit/services"
	"google.golang.org/grpc"
)

// GRPC is a part that serves srv on lis until stopped, then stops
// gracefully (forcibly after grace). A Serve error, or Serve returning on its
// own, fails the part.
func GRPC(name string, srv *grpc.Server, lis net.Listener, grace time.Duration) Part {
	return New(name, services.NewBasicService(nil, func(ctx context.Context) error {
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(lis) }()
		select {
		case err := <-errc:
			return fmt.Errorf("serve %s: %w (the gRPC server stopped)", lis.Addr(), err)
		case <-ctx.Done():
		}
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(grace):
			srv.Stop()
			<-stopped
		}
		<-errc
		return nil
	}, nil))
}
