-- Remove a group's consumers that hold nothing (streams.go): those with
-- no pending record, idle for at least the given time, or named. The
-- check and XGROUP DELCONSUMER are one step, so no pending record is ever
-- dropped with its consumer; a live consumer removed is made again by
-- its next read.
-- KEYS[1]  the stream
-- ARGV[1]  group
-- ARGV[2]  the idle time, ms, past which a consumer without pending
--          records is removed
-- ARGV[3]  the most consumers to remove
-- ARGV[4]  a consumer to remove, whatever its idle time, if it holds
--          nothing; "" for none
-- Returns the number of consumers removed.
local minIdle, most = tonumber(ARGV[2]), tonumber(ARGV[3])
local n = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  if n >= most then
    break
  end
  local name, pending, idle
  for i = 1, #c, 2 do
    if c[i] == 'name' then
      name = c[i + 1]
    elseif c[i] == 'pending' then
      pending = c[i + 1]
    elseif c[i] == 'idle' then
      idle = c[i + 1]
    end
  end
  if pending == 0 and (idle >= minIdle or name == ARGV[4]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    n = n + 1
  end
end
return n
