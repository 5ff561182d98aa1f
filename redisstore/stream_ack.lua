-- Acknowledge records (streams.go): XACK, and forget the group's delays
-- of them if there are any.
-- KEYS[1]  the stream
-- KEYS[2]  the delays hash (see stream_claim.lua)
-- ARGV[1]  group
-- ARGV[2…] record ids, at most maxAckIDs
-- Returns XACK's count: how many were pending.
local f = {}
for i = 2, #ARGV do
  f[#f + 1] = ARGV[1] .. '\0' .. ARGV[i]
end
redis.call('HDEL', KEYS[2], unpack(f))
return redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
