-- ledger_take.lua: take a reservation's record once (ratelimit.Ledger's
-- Take). KEYS[1] is the record's key. A record is its bytes while
-- unsettled and the empty string once settled, under the TTL it was
-- recorded with. Replies: the record; 0 when it was settled before; nil
-- when there is none (never recorded, or expired).
local rec = redis.call('GET', KEYS[1])
if not rec then
  return nil
end
if rec == '' then
  return 0
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return nil
end
redis.call('SET', KEYS[1], '', 'PX', ttl)
return rec
