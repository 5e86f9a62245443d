package acl

import (
	"context"

	"google.golang.org/grpc/metadata"
)

// MetadataKey is the gRPC metadata key that carries a token's secret id
// (Nomad's X-Nomad-Token header).
const MetadataKey = "x-apiary-token"

// EnvToken is the environment variable the CLI reads a token's secret from.
const EnvToken = "APIARY_TOKEN"

// WithToken returns ctx with secret attached as outgoing metadata (for a
// client call). An empty secret returns ctx unchanged.
func WithToken(ctx context.Context, secret string) context.Context {
	if secret == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, MetadataKey, secret)
}

// FromIncoming returns the token secret of a server-side call context:
// the first "x-apiary-token" value, "" when the caller sent none.
func FromIncoming(ctx context.Context) string {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ""
	}
	v := md.Get(MetadataKey)
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// ForwardToken returns out with the token of the incoming call in (if
// any) attached as outgoing metadata: what the router does on every call
// it forwards to a region, so the region judges the caller's own token.
func ForwardToken(in, out context.Context) context.Context {
	return WithToken(out, FromIncoming(in))
}

// MetadataInternal marks a router's own bookkeeping call to a region, made
// for no caller (the region list it reads while routing a submission). A
// region admits such a call without a token only from a router certificate
// and only for AdminService.ListRegions; ForwardRequest and LookupRequest
// (router certificates only, internal/authz) need no token either. The
// router never forwards a caller's metadata but the token, so a caller
// cannot set it.
const MetadataInternal = "x-apiary-internal"

// Internal returns ctx marked as a router's own call (MetadataInternal).
func Internal(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, MetadataInternal, "router")
}

// IsInternal reports whether a server-side call context carries the
// MetadataInternal mark (the caller's role must still be checked).
func IsInternal(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	return ok && len(md.Get(MetadataInternal)) > 0
}
