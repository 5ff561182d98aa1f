-- List the entries of an ExpiringHash (hash.go) that have not expired by
-- the server's clock, and delete the expired ones (and any value this
-- script did not write).
-- KEYS[1]  the hash: field -> "<expiry in server ms>|<value>"
-- Returns field, value and ms left, for each entry in force.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local v = all[i + 1]
  local sep = string.find(v, '|', 1, true)
  local exp = sep and tonumber(string.sub(v, 1, sep - 1))
  if not exp or exp <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = string.sub(v, sep + 1)
    out[#out + 1] = string.format('%d', exp - now)
  end
end
return out
