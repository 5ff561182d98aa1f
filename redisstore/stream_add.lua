-- Add a record to a Stream (streams.go), at most once per key within the
-- dedupe window.
-- KEYS[1]  the stream
-- KEYS[2]  the key's dedupe marker, under the stream's hash tag (only when
--          ARGV[1] is not "")
-- ARGV[1]  the record's key, or "" for a record without one (never
--          deduplicated)
-- ARGV[2]  the dedupe window in ms
-- ARGV[3..] the record's fields and values, in pairs
-- Returns {1, id} when the record was added, {0, id} when a record of the
-- same key was added within the window (id is that record's).
local keyed = ARGV[1] ~= ''
if keyed then
  local prev = redis.call('GET', KEYS[2])
  if prev then
    return {0, prev}
  end
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
if keyed then
  redis.call('SET', KEYS[2], id, 'PX', ARGV[2])
end
return {1, id}
