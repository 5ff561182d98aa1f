package httplimit

import (
	"context"
	"errors"
	"net/http"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/limitheader"
	"github.com/sluicehq/sluice/priority"
)

// ProtectOptions configure Protect. The zero value reads the priority from
// the Sluice-Priority header, trusted up to Normal.
type ProtectOptions struct {
	// Priority, if set, returns a request's priority, replacing the
	// header: use it to give priorities by what the server knows (the
	// route, an authenticated principal) rather than by what the client
	// claims. MaxPriority does not apply to what it returns; an invalid
	// priority is taken as Normal.
	Priority func(*http.Request) priority.Priority
	// MaxPriority is the highest priority the Sluice-Priority header may
	// claim; a higher claim is lowered to it. The zero value is
	// priority.Normal, so an untrusted client can lower its own priority
	// but cannot raise it: set priority.Critical only when every client
	// that reaches the server is trusted (a service mesh, an internal
	// network).
	MaxPriority priority.Priority
	// Overloaded, if set, reports whether a status the handler answered
	// says that the work below is overloaded, so that the request counts
	// as a drop; nil means 503 and 429. A handler whose 429s are answers
	// rather than failures (a rate limit service's "over limit") sets it.
	Overloaded func(status int) bool
}

// Protect returns middleware that guards a handler against overload with
// g, an adaptive.Guard: the Shedder in front of the adaptive concurrency
// limit, a Concurrency (package adaptive explains both).
//
// Each request's priority is read from the Sluice-Priority header
// (priority.Header; the first value, a priority's name in any
// case), lowered to opt.MaxPriority, or given by opt.Priority. A missing or
// invalid value is Normal: an unknown name, such as one a newer client
// sends, is no reason to refuse a request. The priority is put in the
// request's context (priority.NewContext), where the handler, Client and
// grpclimit's client interceptors find it and pass it on to the next
// service.
//
// The request then asks g for a permit (Guard.Acquire: it waits only if the
// Guard's Concurrency has a queue). Refused, it is answered at once, before its
// body is read and without calling the handler: 503 Service Unavailable,
// Retry-After in whole seconds (the Refusal's RetryAfter rounded up, at
// least 1: how long the excess load takes to drain, never a constant) and
// an RFC 9457 problem+json body of type temporary-reduced-capacity saying
// that the server is overloaded, with "retry-after", "priority" and
// "reason" members. Overload is not quota: this is never a 429. A request
// whose context ends while it waits in the queue gets the same 503 with
// Retry-After 1.
//
// Admitted, the request goes to the handler, and its permit ends when the
// handler returns:
//
//   - Dropped when the handler answered 503 or 429 itself (the work below
//     is overloaded; ProtectOptions.Overloaded changes which statuses say
//     so) or the request's context deadline passed (it took too long):
//     both count against the limit, as timeouts and overload answers from
//     below should;
//   - Ignore when the client went away (the context was cancelled) or the
//     handler panicked: neither says anything about capacity;
//   - Done otherwise, its latency a sample of the Guard's controllers.
//
// # Order with the rate limits
//
// Put the rate limits first, outside Protect:
//
//	h = m.Handler(httplimit.Protect(g, opt)(h))
//
// A request over its quota is then answered 429 without reaching the
// Guard, so it takes no overload capacity, and one client's flood of
// refused requests cannot push the Shedder into shedding everyone else's
// work — which is what quotas are for. The Guard measures the handler,
// whose capacity it protects, and not the store's latency; and a 429 from
// the middleware inside Protect would count as a drop. The price: a
// request shed with 503 has already consumed its quota.
//
// The request's context carries a wait account (adaptive.WithWaitAccount):
// the time the handler adds to it with adaptive.AddWait, waiting on a
// store or a service across the network, is left out of the latency the
// Guard measures, so that a distant dependency is not taken for overload.
//
// The middleware is safe for concurrent use. It does not allocate for an
// admitted request beyond the context carrying the wait account and the
// priority, the request bearing it, and the response writer that records
// the status.
func Protect(g *adaptive.Guard, opt ProtectOptions) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, set := requestPriority(r, &opt)
			ctx := adaptive.WithWaitAccount(r.Context())
			if set {
				ctx = priority.NewContext(ctx, p)
			}
			r = r.WithContext(ctx)
			pm, err := g.Acquire(ctx)
			if err != nil {
				refuseOverloaded(w, p, err)
				return
			}
			sw := &statusWriter{ResponseWriter: w}
			finished := false
			defer func() {
				if !finished {
					pm.Ignore() // the handler panicked
				}
			}()
			next.ServeHTTP(sw, r)
			finished = true
			endPermit(&pm, ctx, overloadedStatus(&opt, sw.status))
		})
	}
}

// endPermit ends a permit by the outcome of its request, on the server
// (Protect) and on the client (Client.Concurrency) alike: nothing for a
// request its caller cancelled, a drop for an overload answer or one that
// ran out of time, a completion otherwise.
func endPermit(pm *adaptive.Permit, ctx context.Context, overloaded bool) {
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		pm.Ignore()
	case overloaded || errors.Is(ctx.Err(), context.DeadlineExceeded):
		pm.Dropped()
	default:
		pm.Done()
	}
}

// overloadedStatus reports whether status is an overload answer from below.
func overloadedStatus(opt *ProtectOptions, status int) bool {
	if opt.Overloaded != nil {
		return opt.Overloaded(status)
	}
	return status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests
}

// requestPriority returns r's priority, and whether it is set (by the hook
// or by a header that names a priority).
func requestPriority(r *http.Request, opt *ProtectOptions) (priority.Priority, bool) {
	if opt.Priority != nil {
		p := opt.Priority(r)
		if !p.Valid() {
			p = priority.Normal
		}
		return p, true
	}
	return priority.Trusted(r.Header[priority.Header], opt.MaxPriority)
}

// refuseOverloaded answers 503 for err, the Guard's refusal (or the end of
// the request's context while it waited).
func refuseOverloaded(w http.ResponseWriter, p priority.Priority, err error) {
	var rf adaptive.Refusal
	if !errors.As(err, &rf) {
		rf = adaptive.Refusal{Priority: p}
	}
	secs := limitheader.RetryAfterSeconds(rf.RetryAfter)
	w.Header()["Retry-After"] = fieldValue(appendInt(nil, secs))
	var detail []byte
	if rf.Refused() {
		detail = append(detail, "The server is overloaded and refused this "...)
		detail = append(detail, rf.Priority.String()...)
		detail = append(detail, "-priority request ("...)
		detail = append(detail, rf.Reason.String()...)
		detail = append(detail, "); retry in "...)
	} else {
		detail = append(detail, "The server is overloaded; the request ended while it waited. Retry in "...)
	}
	detail = appendInt(detail, secs)
	detail = append(detail, " s."...)
	b := appendOverloadProblem(make([]byte, 0, 384), detail, secs, func(b []byte) []byte {
		b = append(b, `,"priority":`...)
		b = appendJSON(b, rf.Priority.String())
		if rf.Refused() {
			b = append(b, `,"reason":`...)
			b = appendJSON(b, reasonName(rf.Reason))
		}
		return b
	})
	writeProblem(w, http.StatusServiceUnavailable, b)
}

// reasonName is the problem's "reason" member for r: a stable token for
// programs, where Reason.String is a phrase for people.
func reasonName(r adaptive.Reason) string {
	switch r {
	case adaptive.ReasonShed:
		return "shed"
	case adaptive.ReasonQueueFull:
		return "queue-full"
	case adaptive.ReasonQueueTimeout:
		return "queue-timeout"
	}
	return "concurrency-limit"
}

// statusWriter records the status a handler answers. It unwraps for
// http.ResponseController, so Flush, Hijack and deadlines still reach the
// server's writer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher, which handlers often test for directly.
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// withPriority returns req, or a clone of it carrying the Sluice-Priority
// header, when its context carries a priority other than Normal and req has
// no such header of its own. Normal is what a receiver assumes without the
// header, so it is not sent.
func withPriority(req *http.Request) *http.Request {
	p := priority.FromContext(req.Context())
	if p == priority.Normal || len(req.Header[priority.Header]) > 0 {
		return req
	}
	req = req.Clone(req.Context())
	if req.Header == nil {
		req.Header = make(http.Header)
	}
	req.Header[priority.Header] = []string{p.String()}
	return req
}
