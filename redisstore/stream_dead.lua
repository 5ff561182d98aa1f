-- Dead-letter a record a consumer holds (streams.go): add a copy to the
-- dead-letter stream, with the record's key, the reason, its id and its
-- delivery count, and acknowledge it, in one step, so that a record is
-- dead-lettered once or not at all, and only by the consumer that holds
-- it (as stream_release.lua and stream_extend.lua, a consumer whose record
-- was claimed by another since cannot settle it under the new owner).
-- KEYS[1]  the stream
-- KEYS[2]  the dead-letter stream
-- KEYS[3]  the delays hash (see stream_claim.lua)
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  record id
-- ARGV[4]  the record's key
-- ARGV[5]  the reason
-- Returns the copy's id; 0 when the record is pending for another
-- consumer (as stream_release.lua's 0); -1 when it is not pending in the
-- group (acknowledged or dead-lettered already).
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 then
  return -1
end
if p[1][2] ~= ARGV[2] then
  return 0
end
local f = {}
local e = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
if #e > 0 then
  local fields = e[1][2]
  for i = 1, #fields, 2 do
    local k = fields[i]
    if k ~= 'key' and k ~= 'error' and k ~= 'id' and k ~= 'deliveries' then
      f[#f + 1] = k
      f[#f + 1] = fields[i + 1]
    end
  end
end
f[#f + 1] = 'key'
f[#f + 1] = ARGV[4]
f[#f + 1] = 'error'
f[#f + 1] = ARGV[5]
f[#f + 1] = 'id'
f[#f + 1] = ARGV[3]
f[#f + 1] = 'deliveries'
f[#f + 1] = string.format('%d', p[1][4])
local id = redis.call('XADD', KEYS[2], '*', unpack(f))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('HDEL', KEYS[3], ARGV[1] .. '\0' .. ARGV[3])
return id
