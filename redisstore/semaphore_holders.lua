-- List the unexpired holders of one distributed semaphore, and count its
-- fair waiters, without revealing a token and without writing anything.
-- KEYS[1]  the holders' sorted set: member = token, score = expiry (ms)
-- KEYS[2]  the holders' weights (see semaphore_fair.lua)
-- KEYS[3]  the holders' fences (see semaphore_acquire.lua)
-- KEYS[4]  the holders' grant instants (see semaphore_acquire.lua)
-- KEYS[5]  the waiters' places: hash token -> the instant (ms) it lapses
-- Returns {queued, fence1, weight1, heldfor1, expiresin1, fence2, ...} in
-- milliseconds of the server's clock: the waiters whose place has not
-- lapsed, then for each holder whose expiry is after now its fence (0 for
-- a holder written before fences were), its weight, how long ago it was
-- granted (-1 when not recorded: granted by an older Sluice) and how long
-- it has left.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local queued = 0
local places = redis.call('HVALS', KEYS[5])
for i = 1, #places do
  if tonumber(places[i]) > now then
    queued = queued + 1
  end
end

local out = {queued}
local hs = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #hs, 2 do
  local tok = hs[i]
  local w = redis.call('HGET', KEYS[2], tok)
  local f = redis.call('HGET', KEYS[3], tok)
  local s = redis.call('HGET', KEYS[4], tok)
  local held = -1
  if s then
    held = math.max(now - tonumber(s), 0)
  end
  out[#out + 1] = tonumber(f or '0')
  out[#out + 1] = tonumber(w or '1')
  out[#out + 1] = held
  out[#out + 1] = tonumber(hs[i + 1]) - now
end
return out
