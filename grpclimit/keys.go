package grpclimit

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/ratelimit"
)

// A Key names one dimension of a policy: what picks a call's bucket.
type Key struct {
	// Scope describes the key in QuotaFailure details, e.g. "peer".
	Scope string
	// Append appends the key's value for the call to dst; ok false means
	// the policy does not apply to the call.
	Append func(dst []byte, ctx context.Context, fullMethod string) (b []byte, ok bool)

	// err is why the constructor could not make the key; NewServer
	// reports it.
	err error
}

// ByPeer keys by the IP address of the calling peer ("unknown" when the
// transport has none, as with in-memory connections).
func ByPeer() Key {
	return Key{Scope: "peer", Append: func(dst []byte, ctx context.Context, _ string) ([]byte, bool) {
		if a := peerAddr(ctx); a.IsValid() {
			return a.Unmap().AppendTo(dst), true
		}
		return append(dst, "unknown"...), true
	}}
}

// peerAddr returns the IP address of the calling peer, or the zero Addr.
func peerAddr(ctx context.Context) netip.Addr {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}
	}
	if ta, ok := p.Addr.(*net.TCPAddr); ok {
		// What parsing ta.String() would give, without building the string.
		return ta.AddrPort().Addr()
	}
	ap, _ := netip.ParseAddrPort(p.Addr.String())
	return ap.Addr()
}

// ByMetadata keys by the first value of the incoming metadata key name (an
// API key, a tenant); the policy does not apply to calls without it. A
// store key longer than 256 bytes is replaced by its SHA-256 digest, so a
// caller cannot make the store hold values of any size.
func ByMetadata(name string) Key {
	if name == "" {
		return Key{Scope: "metadata", err: errors.New(`ByMetadata(""): the metadata name is empty`)}
	}
	name = strings.ToLower(name)
	return Key{Scope: "metadata " + name, Append: func(dst []byte, ctx context.Context, _ string) ([]byte, bool) {
		vs := metadata.ValueFromIncomingContext(ctx, name)
		if len(vs) == 0 || vs[0] == "" {
			return dst, false
		}
		return append(dst, vs[0]...), true
	}}
}

// ByMethod keys by the full method name, "/package.Service/Method".
func ByMethod() Key {
	return Key{Scope: "method", Append: func(dst []byte, _ context.Context, m string) ([]byte, bool) {
		return append(dst, m...), true
	}}
}

// A Policy is one limit a Server applies.
type Policy struct {
	// Rule is the limit; its Name must be unique within an Options value.
	Rule ratelimit.Rule
	// Keys pick the bucket; none means one bucket for every call.
	Keys []Key
	// Cost is the cost of a call; nil means 1.
	Cost func(ctx context.Context, fullMethod string) int64
}
