-- Claim a group's records idle past the ack wait (streams.go): XAUTOCLAIM,
-- then a record whose delay (StreamConsumer.Release) has not ended goes
-- back unseen, claimable again when it ends, with its delivery counter as
-- it was.
-- KEYS[1]  the stream
-- KEYS[2]  the delays: a hash of group .. "\0" .. record id -> the
--          instant, in ms of this server's clock, before which the record
--          is not to be delivered to that group (each group holds its own
--          copy of a record, so each has its own delay; a record id has
--          no "\0", so the field is never another group's)
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  the ack wait, ms (XAUTOCLAIM's min-idle-time)
-- ARGV[4]  the start of the scan (a record id; "0-0" to start over)
-- ARGV[5]  COUNT: the most records to claim
-- Returns {next start, {id, deliveries, {field, value, ...}}, ...}; the
-- next start is "0-0" when the scan went through the whole pending list.
local wait = tonumber(ARGV[3])
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], wait, ARGV[4], 'COUNT', ARGV[5])
local out = {r[1]}
local g = ARGV[1] .. '\0'
for _, id in ipairs(r[3] or {}) do
  redis.call('HDEL', KEYS[2], g .. id) -- deleted from the stream: no longer pending
end
if #r[2] == 0 then
  return out
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, e in ipairs(r[2]) do
  local id = e[1]
  local n = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)[1][4]
  local due = redis.call('HGET', KEYS[2], g .. id)
  if due and tonumber(due) > now then
    local left = tonumber(due) - now
    local idle = 0
    if left < wait then
      idle = wait - left
    end
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'IDLE', string.format('%d', idle),
      'RETRYCOUNT', string.format('%d', n - 1), 'JUSTID')
  else
    if due then
      redis.call('HDEL', KEYS[2], g .. id)
    end
    out[#out + 1] = {id, n, e[2]}
  end
end
return out
