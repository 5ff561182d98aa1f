-- Acknowledge a record (streams.go): XACK, and forget the group's delay
-- of it if there is one.
-- KEYS[1]  the stream
-- KEYS[2]  the delays hash (see stream_claim.lua)
-- ARGV[1]  group
-- ARGV[2]  record id
-- Returns XACK's count: 1, or 0 when the record was not pending.
redis.call('HDEL', KEYS[2], ARGV[1] .. '\0' .. ARGV[2])
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
