-- Age retention: drop change-log records older than a position. KEYS: log, meta
-- ARGV: the newest position (ms) to drop, batch size. Returns how many records it dropped.
local old = redis.call('XRANGE', KEYS[1], '-', ARGV[1], 'COUNT', ARGV[2])
if #old == 0 then
  return 0
end
local ids = {}
for i, record in ipairs(old) do
  ids[i] = record[1]
end
redis.call('XDEL', KEYS[1], unpack(ids))
redis.call('HSET', KEYS[2], 'trimmed', ids[#ids])
return #ids
