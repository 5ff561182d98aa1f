// Package dashboard serves a live page of what Sluice's limits are doing:
// the rules, decisions and denials per limit over the last minutes, the
// hottest, most denied and near-limit keys of each limit (package topk),
// the capacity that lease holders have against what they want, the
// semaphores' holdings, what a coordination service (sluice serve) holds
// for remote callers (Options.Coordination: semaphores with their holders
// and waiters, leased services with their remote holders, by member id),
// and the store's health.
//
// A Dashboard is an http.Handler. Mount it under a prefix with
// http.StripPrefix; it answers
//
//	GET /             the page (HTML, a script and a style sheet, embedded;
//	GET /dash.js      nothing is loaded from elsewhere)
//	GET /dash.css
//	GET /status.json  the Status, as JSON; ?k=N entries per table
//
// The page holds no data: it asks for status.json every second with the
// bearer token the operator typed (or gave in the URL's fragment,
// #token=..., which a browser never sends), and shows nothing without it.
// A refusal (401, 403, 429) stops the polling, and the page says why and
// how to go on (enter the token, or reload), so that a tab left open with
// a stale token does not keep failing. The page asks for no favicon.
// Options.Token makes the Dashboard itself check the token; leave it empty
// only when what mounts the Dashboard checks it, as sluice serve's admin
// listener does. The page's script keeps the chart's history itself, from
// the counters of successive answers, so the Dashboard keeps nothing
// between requests and starts no goroutine.
//
// A library user shows a Middleware's limits with Options.Limits (a
// *httplimit.Middleware made with httplimit.Options.Top), lease holders with
// Options.Leases (with WatchLeases, the members and partitions of their
// service too) and semaphores with Options.Semaphores.
//
// A Dashboard is safe for concurrent use.
package dashboard
