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
-- ARGV[1]  token
-- ARGV[2]  "release" (the holder's permit) or "dequeue" (the waiter's place)
-- Returns 1 if token held a permit (or a place), 0 otherwise.
-- When room may have opened for the first waiter, it PUBLISHes the token
-- of the waiter first in line; when nobody queues, it wakes as many plain
-- waiters as the weight released (semaphore_prelude.lua). A wake-up, never a
-- grant. Dequeue forgets the token as a plain waiter too.
local token = ARGV[1]
local head = redis.call('ZRANGE', KEYS[3], 0, 0)
local changed
if ARGV[2] == 'dequeue' then
  redis.call('ZREM', KEYS[7], token)
  changed = redis.call('ZREM', KEYS[3], token)
  redis.call('HDEL', KEYS[4], token)
  -- Only the departure of the head lets another in.
  if changed == 0 or head[1] ~= token then
    return changed
  end
  head = redis.call('ZRANGE', KEYS[3], 0, 0)
  if #head == 0 then
    return 1
  end
  redis.call('PUBLISH', KEYS[5], head[1])
  return 1
end
changed = redis.call('ZREM', KEYS[1], token)
local weight = tonumber(redis.call('HGET', KEYS[2], token) or '1')
redis.call('HDEL', KEYS[2], token)
redis.call('HDEL', KEYS[6], token)
redis.call('HDEL', KEYS[8], token)
if changed == 1 then
  if #head == 1 then
    redis.call('PUBLISH', KEYS[5], head[1])
  else
    local t = redis.call('TIME')
    wake(KEYS[7], KEYS[5], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), weight)
  end
end
return changed
