// Package priority says how much a request matters when a server must
// refuse some: the five priorities (Sheddable, Low, Normal, High,
// Critical; the zero value is Normal), their names (Parse, String), the
// names under which the edges carry them between services (the HTTP
// header field Header, Sluice-Priority, and the gRPC metadata key
// Metadata, sluice-priority; Trusted reads them), and the context that
// carries a request's priority in a process (NewContext, FromContext).
//
// It is a leaf: it depends on the standard library only, so that the
// packages that read, carry or act on a priority — adaptive (which sheds
// the lowest first), httplimit and grpclimit (which read and forward it)
// and drain (which releases the highest first) — share one type without
// importing one another.
package priority
