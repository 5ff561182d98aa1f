-- Release a permit of one distributed semaphore, or take a waiter out of
-- its queue, and tell the waiters.
-- KEYS[1]  the holders' sorted set
-- KEYS[2]  the holders' weights (see semaphore_fair.lua)
-- KEYS[3]  the waiters: sorted set token -> ticket
-- KEYS[4]  the waiters' places: hash token -> the instant (ms) it lapses
-- KEYS[5]  the pub/sub channel of the semaphore (a channel, not a key; it
--          shares the hash tag)
-- KEYS[6]  the holders' fences (see semaphore_acquire.lua); the fence
--          counter is left as it is
-- KEYS[7]  the plain waiters (see semaphore_prelude.lua)
-- KEYS[8]  the holders' grant instants (see semaphore_acquire.lua)
-- KEYS[9]  the holds (see semaphore_prelude.lua)
-- ARGV[1]  token
-- ARGV[2]  "release" (the holder's permit) or "dequeue" (the waiter's place)
-- ARGV[3]  hold in milliseconds (semaphore_acquire.lua)
-- Returns 1 if token held a permit (dequeue: a place or a hold), 0
-- otherwise.
-- When room may have opened for the first waiter, it PUBLISHes the token
-- of the waiter first in line; when nobody queues, it wakes as many plain
-- waiters as the weight released, and the holds it found lapsed, with a
-- hold each (semaphore_prelude.lua). A wake-up, never a grant. Both modes
-- forget the token as a plain waiter and give up its hold, if it has
-- one: that room is passed on as a release's is.
local token, hold = ARGV[1], tonumber(ARGV[3])
local head = redis.call('ZRANGE', KEYS[3], 0, 0)

-- pass tells the first in line, or wakes n plain waiters and as many more
-- as the holds that lapsed.
local function pass(n)
  if #head == 1 then
    redis.call('PUBLISH', KEYS[5], head[1])
    return
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  wake(KEYS[7], KEYS[9], KEYS[5], now, n + lapse(KEYS[9], now), hold)
end

if ARGV[2] == 'dequeue' then
  redis.call('ZREM', KEYS[7], token)
  local held = redis.call('ZREM', KEYS[9], token)
  local changed = redis.call('ZREM', KEYS[3], token)
  redis.call('HDEL', KEYS[4], token)
  -- Only the departure of the head, or of a hold, lets another in.
  if changed == 1 and head[1] == token then
    head = redis.call('ZRANGE', KEYS[3], 0, 0)
    if #head == 1 then
      redis.call('PUBLISH', KEYS[5], head[1])
      return 1
    end
  end
  if held == 1 then
    pass(1)
  end
  return math.max(changed, held)
end
-- A release forgets the token as a plain waiter too, and gives up its
-- hold (an acquire whose answer was lost, released by its caller).
redis.call('ZREM', KEYS[7], token)
local held = redis.call('ZREM', KEYS[9], token)
local changed = redis.call('ZREM', KEYS[1], token)
local weight = tonumber(redis.call('HGET', KEYS[2], token) or '1')
redis.call('HDEL', KEYS[2], token)
redis.call('HDEL', KEYS[6], token)
redis.call('HDEL', KEYS[8], token)
if changed == 1 then
  pass(weight + held)
elseif held == 1 then
  pass(1)
end
return changed
