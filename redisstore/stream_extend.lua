-- Reset the idle time of a record a consumer holds, so that it is not
-- claimed for another ack wait (streams.go). XCLAIM with JUSTID leaves the
-- delivery counter as it is.
-- KEYS[1]  the stream
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  record id
-- Returns 1, or 0 when the record is not pending for this consumer.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
