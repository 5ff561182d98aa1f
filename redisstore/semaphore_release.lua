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
-- ARGV[1]  token
-- ARGV[2]  "release" (the holder's permit) or "dequeue" (the waiter's place)
-- Returns 1 if token held a permit (or a place), 0 otherwise.
-- When room may have opened for the first waiter, it PUBLISHes the token
-- of the waiter first in line, or "" when nobody queues: a wake-up, never
-- a grant.
local token = ARGV[1]
local head = redis.call('ZRANGE', KEYS[3], 0, 0)
local changed
if ARGV[2] == 'dequeue' then
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
else
  changed = redis.call('ZREM', KEYS[1], token)
  redis.call('HDEL', KEYS[2], token)
  redis.call('HDEL', KEYS[6], token)
end
if changed == 1 then
  redis.call('PUBLISH', KEYS[5], head[1] or '')
end
return changed
