-- Put back a record a consumer holds, to be claimed again after a delay
-- (streams.go). The record stays in the group's pending list, idle as if
-- delivered the ack wait less the delay ago, so that XAUTOCLAIM takes it
-- when the delay ends; the instant it ends is also written in the delays
-- hash, under the group and the record id, which stream_claim.lua honours
-- (for a delay beyond the ack wait, or a claimer whose ack wait is longer).
-- KEYS[1]  the stream
-- KEYS[2]  the delays hash (see stream_claim.lua)
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  record id
-- ARGV[4]  the ack wait, ms
-- ARGV[5]  the delay, ms
-- Returns 1, or 0 when the record is not pending for this consumer
-- (acknowledged, or claimed by another).
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then
  return 0
end
local wait, delay = tonumber(ARGV[4]), tonumber(ARGV[5])
local field = ARGV[1] .. '\0' .. ARGV[3]
if delay == 0 then
  redis.call('HDEL', KEYS[2], field)
else
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', KEYS[2], field, string.format('%d', now + delay))
end
local idle = 0
if delay < wait then
  idle = wait - delay
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', string.format('%d', idle), 'JUSTID')
return 1
