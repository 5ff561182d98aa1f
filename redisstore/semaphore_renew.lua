-- Renew one holder's permit; never creates one, and keeps its weight and
-- its fence.
-- KEYS[1]  the semaphore's sorted set
-- KEYS[2]  the holders' weights (see semaphore_fair.lua)
-- KEYS[3]  the holders' fences (see semaphore_acquire.lua)
-- KEYS[4]  the holders' grant instants (see semaphore_acquire.lua); kept
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
  redis.call('HDEL', KEYS[2], token)
  redis.call('HDEL', KEYS[3], token)
  redis.call('HDEL', KEYS[4], token)
  return 0
end
redis.call('ZADD', key, 'XX', now + ttl, token)
-- The weights, fences and grant instants live as long as the holders
-- they describe.
for k = 1, 4 do
  keep(KEYS[k], ttl)
end
return 1
