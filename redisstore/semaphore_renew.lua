-- Renew one holder's permit; never creates one.
-- KEYS[1]  the semaphore's sorted set
-- ARGV[1]  token
-- ARGV[2]  ttl in milliseconds
-- Returns 1 if the permit was held and is extended, 0 if it is gone.
local key, token, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local exp = redis.call('ZSCORE', key, token)
if not exp then
  return 0
end
if tonumber(exp) <= now then
  redis.call('ZREM', key, token)
  return 0
end
redis.call('ZADD', key, 'XX', now + ttl, token)
if redis.call('PTTL', key) < ttl then
  redis.call('PEXPIRE', key, ttl)
end
return 1
