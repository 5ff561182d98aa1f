-- The prelude of every semaphore script (loaded in front of each): what
-- they share.

-- keep makes key k live at least ms milliseconds more.
local function keep(k, ms)
  if redis.call('PTTL', k) < ms then
    redis.call('PEXPIRE', k, ms)
  end
end

-- wake tells up to n waiters that room may have opened. It names the
-- plain waiters recorded in pw (a sorted set token -> the instant, in ms
-- of the server's clock, its place lapses; semaphore_acquire.lua records
-- a refused token there), those that asked least recently first, one
-- PUBLISH on channel each, and forgets them: a waiter named asks again,
-- and a refused one is recorded again. When none is recorded, it
-- PUBLISHes "" once, which wakes one waiter in each process that has one
-- (a waiter that records nothing, of an older Sluice, still hears).
-- Lapsed places are forgotten first.
local function wake(pw, channel, now, n)
  redis.call('ZREMRANGEBYSCORE', pw, '-inf', now)
  if n <= 0 then
    return
  end
  local ws = redis.call('ZRANGE', pw, 0, n - 1)
  if #ws == 0 then
    redis.call('PUBLISH', channel, '')
    return
  end
  redis.call('ZREM', pw, unpack(ws))
  for i = 1, #ws do
    redis.call('PUBLISH', channel, ws[i])
  end
end

