-- The prelude of every semaphore script (loaded in front of each): what
-- they share.

-- keep makes key k live at least ms milliseconds more.
local function keep(k, ms)
  if redis.call('PTTL', k) < ms then
    redis.call('PEXPIRE', k, ms)
  end
end

-- Holds: room kept for a waiter that a script named (see wake), in a
-- sorted set token -> the instant (ms of the server's clock) the hold
-- lapses. While a hold has not lapsed, every acquire by another token
-- counts it as a unit used (it is room, never a permit: the named
-- waiter's own acquire takes its hold in place of room, so the permits
-- and holds together stay within the limit); the waiter's acquire
-- consumes it. A hold that lapses (its waiter slow, dead or gone) is
-- room opened: the script that finds it lapsed wakes another waiter.

-- lapse forgets the holds in hk that have lapsed at now and returns how
-- many it forgot.
local function lapse(hk, now)
  return redis.call('ZREMRANGEBYSCORE', hk, '-inf', now)
end

-- wake tells up to n waiters that room may have opened. It names the
-- plain waiters recorded in pw (a sorted set token -> the instant, in ms
-- of the server's clock, its place lapses; semaphore_acquire.lua records
-- a refused token there), those that asked least recently first, one
-- PUBLISH on channel each, and forgets them: a waiter named asks again,
-- and a refused one is recorded again. With hold > 0 each one named gets
-- a hold in hk (see above) until now + hold, or until its place lapses
-- if that is sooner, so that whoever asks first, the room is its. When
-- none is recorded, it PUBLISHes "" once, which wakes one waiter in each
-- process that has one (a waiter that records nothing, of an older
-- Sluice, still hears), and holds nothing. Lapsed places are forgotten
-- first.
local function wake(pw, hk, channel, now, n, hold)
  redis.call('ZREMRANGEBYSCORE', pw, '-inf', now)
  if n <= 0 then
    return
  end
  local ws = redis.call('ZRANGE', pw, 0, n - 1, 'WITHSCORES')
  if #ws == 0 then
    redis.call('PUBLISH', channel, '')
    return
  end
  for i = 1, #ws, 2 do
    redis.call('ZREM', pw, ws[i])
    if hold > 0 then
      redis.call('ZADD', hk, math.min(now + hold, tonumber(ws[i + 1])), ws[i])
    end
    redis.call('PUBLISH', channel, ws[i])
  end
  if hold > 0 then
    keep(hk, hold)
  end
end

