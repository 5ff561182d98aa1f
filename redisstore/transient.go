package redisstore

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// transientError marks an error after which Redis may well answer the
// same call soon: concurrency.Transient reads the mark, so that a blocked
// acquire waits through it. Timeouts and connection errors need no mark
// (concurrency.Transient knows them by their types).
type transientError struct{ err error }

func (e transientError) Error() string   { return e.err.Error() }
func (e transientError) Unwrap() error   { return e.err }
func (e transientError) Transient() bool { return true }

// markTransient returns err marked as transient when it is go-redis's
// wait for a pooled connection timing out, or Redis answering that it
// cannot serve the call yet (LOADING, BUSY, READONLY after a failover,
// MASTERDOWN, CLUSTERDOWN, TRYAGAIN, the most clients reached); any other
// err as it is.
func markTransient(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) ||
		redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsMasterDownError(err) ||
		redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsMaxClientsError(err) ||
		strings.HasPrefix(err.Error(), "BUSY ") {
		return transientError{err}
	}
	return err
}
