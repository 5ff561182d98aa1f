-- Acquire a weighted permit of one distributed semaphore, in arrival order.
-- KEYS[1]  the holders' sorted set: member = token, score = expiry (ms, server clock)
-- KEYS[2]  the holders' weights: hash token -> weight (absent: 1)
-- KEYS[3]  the waiters: sorted set token -> ticket (arrival order)
-- KEYS[4]  the waiters' places: hash token -> the instant (ms) it lapses
-- KEYS[5]  the ticket counter
-- KEYS[6]  the semaphore's pub/sub channel (see semaphore_release.lua)
-- KEYS[7]  the holders' fences: hash token -> fence
-- KEYS[8]  the fence counter: the last fence granted; it never expires
-- KEYS[9]  the holders' grant instants: hash token -> ms (see
--          semaphore_acquire.lua)
-- KEYS[10] the holds: sorted set token -> the instant (ms) it lapses
--          (semaphore_prelude.lua)
-- KEYS[11] the plain waiters (semaphore_prelude.lua)
-- ARGV[1]  token
-- ARGV[2]  weight
-- ARGV[3]  limit (the most weight held)
-- ARGV[4]  ttl in milliseconds
-- ARGV[5]  wait in milliseconds: how long the token keeps its place if it
--          must wait; 0 to queue nothing
-- ARGV[6]  the cutoff: Unix ns of the server's clock past which the caller
--          has given up on the call, or "" for none (see clock.go)
-- ARGV[7]  hold in milliseconds (semaphore_acquire.lua)
-- Returns {2, fence} when token holds the permit (the fence it had if it
-- held it already, the counter's next value if not), {1, 0} when it is
-- first in line and waits for room, {0, 0} when others wait before it,
-- {-1, 0} (having done nothing) past the cutoff.
-- The holds of other tokens count as used (semaphore_prelude.lua); a
-- token's own hold is taken in place of room.
-- When the head of the line changed (a waiter granted or lapsed), expired
-- holders or lapsed holds were forgotten, or token gave up a hold, and
-- room is left, it PUBLISHes the token of the waiter now first in line,
-- so that it asks at once; with nobody in line, when room opened, it wakes
-- the plain waiters (with holds) instead.
local token = ARGV[1]
local weight, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, wait, hold = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[7])
local t = redis.call('TIME')
local cut = ARGV[6]
if cut ~= '' and (string.sub(cut, 1, -10) - t[1]) * 1000000000 + (string.sub(cut, -9) - t[2] * 1000) < 0 then
  return {-1, 0}
end
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Forget holders whose expiry has passed, and their weights.
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('HDEL', KEYS[2], unpack(gone))
  redis.call('HDEL', KEYS[7], unpack(gone))
  redis.call('HDEL', KEYS[9], unpack(gone))
end

-- Lapsed holds are room opened; token's own hold is taken here.
local opened = lapse(KEYS[10], now) + redis.call('ZREM', KEYS[10], token)

-- used returns the weight held and the holds of others.
local function used()
  local n = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[10])
  local ws = redis.call('HVALS', KEYS[2])
  for i = 1, #ws do
    n = n + tonumber(ws[i]) - 1
  end
  return n
end

-- tell wakes the waiter first in line, if it is another and room is left;
-- with nobody in line and plain set, the plain waiters there is room for.
local function tell(plain)
  local room = limit - used()
  if room <= 0 then
    return
  end
  local h = redis.call('ZRANGE', KEYS[3], 0, 0)
  if #h == 1 then
    if h[1] ~= token then
      redis.call('PUBLISH', KEYS[6], h[1])
    end
  elseif plain then
    wake(KEYS[11], KEYS[10], KEYS[6], now, room, hold)
  end
end

-- grant makes token a holder for ttl with the next fence, and returns it.
local function grant()
  redis.call('ZADD', KEYS[1], now + ttl, token)
  local fence = redis.call('INCR', KEYS[8])
  redis.call('HSET', KEYS[7], token, fence)
  keep(KEYS[1], ttl)
  keep(KEYS[7], ttl)
  return fence
end

if redis.call('ZSCORE', KEYS[1], token) then
  -- A renewal keeps its fence (a holder without one, written before
  -- fences were, takes one).
  local fence = redis.call('HGET', KEYS[7], token)
  if fence then
    redis.call('ZADD', KEYS[1], now + ttl, token)
  else
    fence = grant()
  end
  -- Its grant instant, if recorded, is kept as it is (a holder granted by
  -- an older Sluice stays without one).
  for _, k in ipairs({KEYS[1], KEYS[2], KEYS[7], KEYS[9]}) do
    keep(k, ttl)
  end
  if opened > 0 or #gone > 0 then
    tell(true)
  end
  return {2, tonumber(fence)}
end

-- Waiters whose place lapsed leave the head of the line.
local freed = #gone > 0 or opened > 0
local changed = freed
while true do
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)
  if #head == 0 then
    break
  end
  local until_ = tonumber(redis.call('HGET', KEYS[4], head[1]) or '0')
  if until_ > now then
    break
  end
  redis.call('ZREM', KEYS[3], head[1])
  redis.call('HDEL', KEYS[4], head[1])
  changed = true
end

local head = redis.call('ZRANGE', KEYS[3], 0, 0)
local first = #head == 0 or head[1] == token
if first then
  if used() + weight <= limit then
    local fence = grant()
    redis.call('HSET', KEYS[9], token, now)
    keep(KEYS[9], ttl)
    if weight ~= 1 then
      redis.call('HSET', KEYS[2], token, weight)
      keep(KEYS[2], ttl)
    end
    redis.call('ZREM', KEYS[3], token)
    redis.call('HDEL', KEYS[4], token)
    tell(freed)
    return {2, fence}
  end
end
if changed then
  tell(freed)
end
if wait > 0 then
  if not redis.call('ZSCORE', KEYS[3], token) then
    redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[5]), token)
  end
  redis.call('HSET', KEYS[4], token, now + wait)
  for k = 3, 5 do
    keep(KEYS[k], 2 * wait + 1000)
  end
end
if first then
  return {1, 0}
end
return {0, 0}
