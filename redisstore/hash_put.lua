-- Set one entry of an ExpiringHash (hash.go).
-- KEYS[1]  the hash: field -> "<expiry in server ms>|<value>"
-- ARGV[1]  field
-- ARGV[2]  value
-- ARGV[3]  time to live in ms
local t = redis.call('TIME')
local exp = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', exp) .. '|' .. ARGV[2])
return 1
