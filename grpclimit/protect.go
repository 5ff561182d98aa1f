package grpclimit

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/priority"
)

// ProtectOptions configure ProtectUnary and ProtectStream. The zero value
// guards every method and reads the priority from the sluice-priority
// metadata, trusted up to Normal.
type ProtectOptions struct {
	// Priority, if set, returns a call's priority, replacing the metadata
	// (MaxPriority does not apply to it; an invalid one is Normal).
	Priority func(ctx context.Context, fullMethod string) priority.Priority
	// MaxPriority is the highest priority the sluice-priority metadata may
	// claim; a higher claim is lowered to it. The zero value is Normal, so
	// an untrusted caller cannot raise its own priority.
	MaxPriority priority.Priority
	// Skip, if set, reports the methods ("/package.Service/Method") that
	// are not guarded, such as health checks and reflection.
	Skip func(fullMethod string) bool
}

// ProtectUnary returns a unary server interceptor that guards the calls
// with g, an adaptive.Guard, as httplimit.Protect does HTTP requests.
//
// A call's priority is the first value of the sluice-priority metadata
// (priority.Metadata), lowered to opt.MaxPriority, or opt.Priority's;
// a missing or invalid value is Normal. It is put in the call's context,
// where the client interceptors find it and pass it on.
//
// A call the Guard refuses fails at once, without calling the handler,
// with codes.Unavailable — the server is overloaded; this is not a quota,
// whose refusals are RESOURCE_EXHAUSTED — a message saying so, and a
// google.rpc.RetryInfo detail whose retry_delay is the Refusal's
// RetryAfter, computed from the Guard's state. (The rate-limit Server
// writes no retry-after trailer, and neither does this.) A call whose
// context ends while it waits in the Guard's queue fails with the
// context's status.
//
// The call's context carries a wait account (adaptive.WithWaitAccount):
// the time the handler adds to it with adaptive.AddWait, waiting on a
// store or a service across the network, is left out of the latency the
// Guard measures.
//
// An admitted call's permit ends when the handler returns: Dropped when it
// failed with Unavailable, ResourceExhausted or DeadlineExceeded, or its
// deadline passed; Ignore when it failed with Canceled or its caller went
// away, or the handler panicked; Done otherwise.
//
// Chain it after the rate-limit Server's interceptor, for the reasons
// httplimit.Protect gives: grpc.ChainUnaryInterceptor(s.UnaryInterceptor(),
// grpclimit.ProtectUnary(g, opt)).
func ProtectUnary(g *adaptive.Guard, opt ProtectOptions) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		if opt.Skip != nil && opt.Skip(info.FullMethod) {
			return handler(ctx, req)
		}
		ctx, pm, err := admitCall(ctx, g, &opt, info.FullMethod)
		if err != nil {
			return nil, err
		}
		finished := false
		defer func() {
			if !finished {
				pm.Ignore() // the handler panicked
			}
		}()
		resp, err = handler(ctx, req)
		finished = true
		endPermit(ctx, &pm, err)
		return resp, err
	}
}

// ProtectStream returns the stream server interceptor doing what
// ProtectUnary does, once when the stream starts; the permit is held for
// the stream's life. A stream's lifetime is no service time, so a stream
// that ends well is ended with Ignore (its slot given back, its duration
// no latency sample); one that fails as an overloaded call does is
// Dropped. Long-lived streams that should not hold a slot belong in
// ProtectOptions.Skip.
func ProtectStream(g *adaptive.Guard, opt ProtectOptions) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if opt.Skip != nil && opt.Skip(info.FullMethod) {
			return handler(srv, ss)
		}
		ctx, pm, err := admitCall(ss.Context(), g, &opt, info.FullMethod)
		if err != nil {
			return err
		}
		defer pm.Ignore() // after Dropped, or after a panic: does nothing more
		err = handler(srv, &priorityStream{ServerStream: ss, ctx: ctx})
		if overloadedOutcome(ctx, err) {
			pm.Dropped()
		}
		return err
	}
}

// priorityStream is a ServerStream whose context carries the priority.
type priorityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *priorityStream) Context() context.Context { return s.ctx }

// admitCall reads the call's priority into ctx and asks g for a permit,
// returning the status error that refuses the call.
func admitCall(ctx context.Context, g *adaptive.Guard, opt *ProtectOptions, method string) (context.Context, adaptive.Permit, error) {
	ctx = adaptive.WithWaitAccount(ctx)
	if p, ok := callPriority(ctx, opt, method); ok {
		ctx = priority.NewContext(ctx, p)
	}
	pm, err := g.Acquire(ctx)
	if err == nil {
		return ctx, pm, nil
	}
	var rf adaptive.Refusal
	if !errors.As(err, &rf) {
		return ctx, pm, status.FromContextError(ctx.Err()).Err()
	}
	return ctx, pm, unavailable(rf.RetryAfter, "server overloaded: "+rf.Priority.String()+"-priority call refused ("+rf.Reason.String()+")")
}

// callPriority returns the call's priority and whether it is set.
func callPriority(ctx context.Context, opt *ProtectOptions, method string) (priority.Priority, bool) {
	if opt.Priority != nil {
		p := opt.Priority(ctx, method)
		if !p.Valid() {
			p = priority.Normal
		}
		return p, true
	}
	return priority.Trusted(metadata.ValueFromIncomingContext(ctx, priority.Metadata), opt.MaxPriority)
}

// endPermit ends a unary call's permit by its outcome, on the server
// (ProtectUnary) and on the client (Client.Concurrency) alike.
func endPermit(ctx context.Context, pm *adaptive.Permit, err error) {
	switch {
	case cancelledByCaller(ctx, err):
		pm.Ignore()
	case overloadedOutcome(ctx, err):
		pm.Dropped()
	default:
		pm.Done()
	}
}

// deadlineSlack is how near its deadline a call cancelled counts as one
// that ran out of time: the caller's deadline reaches a server as a
// cancellation (RST_STREAM) when the caller's timer fires, which is a
// little before the server's own, set from grpc-timeout on arrival.
const deadlineSlack = 10 * time.Millisecond

// cancelledByCaller reports whether a call that ended with err was
// cancelled by its caller, not by its deadline.
func cancelledByCaller(ctx context.Context, err error) bool {
	if !errors.Is(ctx.Err(), context.Canceled) && status.Code(err) != codes.Canceled {
		return false
	}
	dl, ok := ctx.Deadline()
	return !ok || time.Until(dl) > deadlineSlack
}

// overloadedOutcome reports whether a call that ended with err counts as a
// drop: the work below was overloaded, or the call ran out of time.
func overloadedOutcome(ctx context.Context, err error) bool {
	if cancelledByCaller(ctx, err) {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded:
		return true
	}
	return ctx.Err() != nil // its deadline, or cancelled at it
}

// withOutgoingPriority returns ctx with the sluice-priority metadata set to
// the priority ctx carries, when it carries one other than Normal (what a
// server assumes without the metadata) and the outgoing metadata has none.
func withOutgoingPriority(ctx context.Context) context.Context {
	p := priority.FromContext(ctx)
	if p == priority.Normal {
		return ctx
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(priority.Metadata)) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, priority.Metadata, p.String())
}
