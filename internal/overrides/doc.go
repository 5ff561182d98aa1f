// Package overrides keeps serve's runtime overrides of rule limits where
// every replica finds them, and keeps each replica's table in step with
// them.
//
// A Store holds the overrides with their expiry: MemoryStore in this
// process (one replica, or replicas with separate counters), RedisStore in
// a redisstore.ExpiringHash shared by every replica of one Redis and
// prefix, expiring by the Redis server's clock. A Sync copies a Store into
// a service.Overrides, the table the service decides with: Run polls every
// Every (DefaultPoll), a goroutine for the life of serve; Sync reads once,
// which the admin API calls after each change so that the replica that
// made it applies it at once and the others within a poll.
//
// The admin API's HTTP handlers (internal/httpapi) validate a request and
// call a Store and a Sync; nothing here knows HTTP. The override itself
// (service.Override, its Check against the loaded rules) and the table
// (service.Overrides) stay in internal/service: the service reads the
// table on every decision and rebuilds it when it switches rule sets, and
// a service that imported this package would link go-redis through
// RedisStore.
package overrides
