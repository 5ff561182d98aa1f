-- Sluice capacity leases: one script, one operation per call.
--
-- KEYS[1]  members ZSET: member id -> expiry (server ms)
-- KEYS[2]  member info HASH: member id -> "weight need want"
-- KEYS[3]  partitions HASH: partition index -> "epoch expiry owner"
--          (expiry in server ms; owner "" and expiry 0 once released)
-- KEYS[4]  not a key: the pub/sub channel on which the id of a member is
--          published when it joins, raises its need, releases partitions
--          or leaves (it carries the service's hash tag too)
-- ARGV[1]  operation: heartbeat, acquire, renew, release, leave, valid
-- ARGV[2]  member id
-- ARGV[3]  ttl in ms (heartbeat, acquire, renew)
-- then per operation, see below.
--
-- Instants are the server's TIME in ms (13 digits: exact in doubles and in
-- Lua's number formatting). Epochs are never reset: the partitions hash
-- has no TTL, and releasing keeps the epoch.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, id, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])

-- parse splits a partitions hash value, or returns 0, 0, '' for none.
local function parse(v)
  if not v then
    return 0, 0, ''
  end
  local e, x, o = string.match(v, '^(%d+) (%d+) (.*)$')
  return tonumber(e), tonumber(x), o
end

local function part(p)
  return parse(redis.call('HGET', KEYS[3], p))
end

local function put(p, epoch, expiry, owner)
  redis.call('HSET', KEYS[3], p, string.format('%d %d %s', epoch, expiry, owner))
end

if op == 'heartbeat' then
  -- ARGV[4] weight, ARGV[5] need, ARGV[6] want, ARGV[7] partitions.
  -- Returns {n, id1, weight1, need1, want1, ...,
  --          owner0, epoch0, ttl0 (ms), owner1, ...}.
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    redis.call('HDEL', KEYS[2], unpack(gone))
  end
  local known = redis.call('ZSCORE', KEYS[1], id)
  local before = redis.call('HGET', KEYS[2], id)
  redis.call('ZADD', KEYS[1], now + ttl, id)
  redis.call('HSET', KEYS[2], id, ARGV[4] .. ' ' .. ARGV[5] .. ' ' .. ARGV[6])
  local oldNeed = before and tonumber(string.match(before, '^%S+ (%S+) ')) or -1
  if not known or tonumber(ARGV[5]) > oldNeed then
    redis.call('PUBLISH', KEYS[4], id)
  end
  -- Presence keys outlive the longest presence by a margin, then vanish.
  redis.call('PEXPIRE', KEYS[1], 2 * ttl + 60000)
  redis.call('PEXPIRE', KEYS[2], 2 * ttl + 60000)
  local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
  table.sort(ids)
  local out = {#ids}
  for _, m in ipairs(ids) do
    local info = redis.call('HGET', KEYS[2], m) or '1 0 0'
    local w, need, want = string.match(info, '^(%S+) (%S+) (%S+)$')
    out[#out + 1] = m
    out[#out + 1] = w
    out[#out + 1] = need
    out[#out + 1] = want
  end
  local all = redis.call('HGETALL', KEYS[3])
  local byP = {}
  for i = 1, #all, 2 do
    byP[all[i]] = all[i + 1]
  end
  for p = 0, tonumber(ARGV[7]) - 1 do
    local epoch, expiry, owner = parse(byP[tostring(p)])
    local left = expiry - now
    if left <= 0 then
      owner, left = '', 0
    end
    out[#out + 1] = owner
    out[#out + 1] = epoch
    out[#out + 1] = left
  end
  return out
elseif op == 'acquire' then
  -- ARGV[4] the cutoff: Unix ns of the server's clock past which the
  -- caller has given up on the call, or "" for none (see clock.go);
  -- ARGV[5..] partitions. Returns {p1, epoch1, p2, epoch2, ...} granted;
  -- past the cutoff, -1, having granted nothing.
  local cut = ARGV[4]
  if cut ~= '' and (string.sub(cut, 1, -10) - t[1]) * 1000000000 + (string.sub(cut, -9) - t[2] * 1000) < 0 then
    return -1
  end
  local out = {}
  for i = 5, #ARGV do
    local p = ARGV[i]
    local epoch, expiry, owner = part(p)
    if expiry <= now or owner == id then
      put(p, epoch + 1, now + ttl, id)
      out[#out + 1] = tonumber(p)
      out[#out + 1] = epoch + 1
    end
  end
  return out
elseif op == 'renew' then
  -- ARGV[4..] pairs of partition, epoch. Returns 1 or 0 per pair.
  local out = {}
  for i = 4, #ARGV, 2 do
    local epoch, expiry, owner = part(ARGV[i])
    if owner == id and epoch == tonumber(ARGV[i + 1]) and expiry > now then
      put(ARGV[i], epoch, now + ttl, id)
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
  end
  return out
elseif op == 'release' then
  -- ARGV[4..] pairs of partition, epoch. Returns the number released.
  local n = 0
  for i = 4, #ARGV, 2 do
    local epoch, expiry, owner = part(ARGV[i])
    if owner == id and epoch == tonumber(ARGV[i + 1]) then
      put(ARGV[i], epoch, 0, '')
      n = n + 1
    end
  end
  if n > 0 then
    redis.call('PUBLISH', KEYS[4], id)
  end
  return n
elseif op == 'leave' then
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('PUBLISH', KEYS[4], id)
  end
  redis.call('HDEL', KEYS[2], id)
  return 1
elseif op == 'valid' then
  -- ARGV[4] partition, ARGV[5] epoch. Returns 1 when that lease is current.
  local epoch, expiry, owner = part(ARGV[4])
  if owner ~= '' and epoch == tonumber(ARGV[5]) and expiry > now then
    return 1
  end
  return 0
end
return redis.error_reply('lease.lua: unknown operation ' .. tostring(op))
