-- Acquire a permit of one distributed semaphore.
-- KEYS[1]  the semaphore's sorted set: member = token, score = expiry (ms, server clock)
-- KEYS[2]  the weights above 1 of its holders (see semaphore_fair.lua)
-- KEYS[3]  the semaphore's pub/sub channel (see semaphore_release.lua)
-- KEYS[4]  the holders' fences: hash token -> fence
-- KEYS[5]  the fence counter: the last fence granted; it never expires
-- KEYS[6]  the plain waiters: sorted set token -> the instant (ms) its
--          place lapses (see semaphore_prelude.lua)
-- KEYS[7]  the holders' grant instants: hash token -> ms of the server's
--          clock when the permit was granted; a renewal keeps it
-- KEYS[8]  the fair waiters: sorted set token -> ticket (semaphore_fair.lua)
-- KEYS[9]  the fair waiters' places: hash token -> the instant (ms) it lapses
-- KEYS[10] the holds: sorted set token -> the instant (ms) it lapses
--          (semaphore_prelude.lua)
-- ARGV[1]  token
-- ARGV[2]  limit (most holders)
-- ARGV[3]  ttl in milliseconds
-- ARGV[4]  the cutoff: Unix ns of the server's clock past which the caller
--          has given up on the call, or "" for none (see clock.go)
-- ARGV[5]  wait in milliseconds: how long a refused token stays recorded
--          as a waiter, to be named when room opens; 0 to record nothing
-- ARGV[6]  hold in milliseconds: how long a waiter it names has the room
--          to itself (semaphore_prelude.lua); 0 to hold nothing
-- Returns the fence of token's permit if it holds one afterwards (the one
-- it had if it held it already, the counter's next value if not), 0 if the
-- semaphore is full (the holds of other tokens counted as used) or fair
-- waiters queue (a waiter that waited long enough queues, and is not to
-- be overtaken), -1 (having done nothing) past the cutoff. A token's own
-- hold is taken in place of room: granted, it is consumed; refused (fair
-- waiters queue), it is given up. When it forgot expired holders or
-- lapsed holds, or gave up its hold, and room is left, it wakes as many
-- waiters as the room left (semaphore_prelude.lua), or tells the first
-- fair waiter: the room opened may be more than it takes. (When the last
-- holder expires, the key expires with it: nothing to see.)
local key, token = KEYS[1], ARGV[1]
local limit, ttl, wait, hold = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5]), tonumber(ARGV[6])
local t = redis.call('TIME')
local cut = ARGV[4]
if cut ~= '' and (string.sub(cut, 1, -10) - t[1]) * 1000000000 + (string.sub(cut, -9) - t[2] * 1000) < 0 then
  return -1
end
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Forget holders whose expiry has passed (an expiry equal to now has passed),
-- and their weights.
local gone = redis.call('ZRANGEBYSCORE', key, '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('HDEL', KEYS[2], unpack(gone))
  redis.call('HDEL', KEYS[4], unpack(gone))
  redis.call('HDEL', KEYS[7], unpack(gone))
end

-- Lapsed holds are room opened; token's own hold is taken here (granted,
-- it is consumed; refused, given up).
local opened = lapse(KEYS[10], now) + redis.call('ZREM', KEYS[10], token)

-- used returns the weight held and the holds of others, or at least
-- limit when that is reached.
local function used()
  local n = redis.call('ZCARD', key) + redis.call('ZCARD', KEYS[10])
  if n < limit and redis.call('EXISTS', KEYS[2]) == 1 then
    local ws = redis.call('HVALS', KEYS[2])
    for i = 1, #ws do
      n = n + tonumber(ws[i]) - 1
    end
  end
  return n
end

-- queued reports whether a fair waiter's place holds; the waiters whose
-- place lapsed leave the head of the line (their successor, if any, asks
-- within its backoff).
local function queued()
  while true do
    local head = redis.call('ZRANGE', KEYS[8], 0, 0)
    if #head == 0 then
      return false
    end
    if tonumber(redis.call('HGET', KEYS[9], head[1]) or '0') > now then
      return true
    end
    redis.call('ZREM', KEYS[8], head[1])
    redis.call('HDEL', KEYS[9], head[1])
  end
end

-- tell passes on the room left, if any: to the first fair waiter when
-- one queues, else to the plain waiters (with holds).
local function tell()
  local room = limit - used()
  if room <= 0 then
    return
  end
  if queued() then
    redis.call('PUBLISH', KEYS[3], redis.call('ZRANGE', KEYS[8], 0, 0)[1])
  else
    wake(KEYS[6], KEYS[10], KEYS[3], now, room, hold)
  end
end

local held = redis.call('ZSCORE', key, token)
if not held and (used() >= limit or queued()) then
  if opened > 0 or #gone > 0 then
    tell()
  end
  if wait > 0 then
    redis.call('ZADD', KEYS[6], now + wait, token)
    keep(KEYS[6], wait)
  end
  return 0
end
redis.call('ZREM', KEYS[6], token)
redis.call('ZADD', key, now + ttl, token)
-- A renewal keeps its fence and its grant instant; a grant (or a holder
-- without a fence, written before fences were) takes the next fence, and
-- a grant records its instant (a holder written before grant instants
-- were is listed without one).
local fence = held and redis.call('HGET', KEYS[4], token)
if not fence then
  fence = redis.call('INCR', KEYS[5])
  redis.call('HSET', KEYS[4], token, fence)
end
if not held then
  redis.call('HSET', KEYS[7], token, now)
end
-- The keys live as long as their longest-lived holder.
for _, k in ipairs({key, KEYS[2], KEYS[4], KEYS[7]}) do
  keep(k, ttl)
end
if #gone > 0 or opened > 0 then
  tell()
end
return tonumber(fence)
