-- Bring up to `count` proposals of an earlier release, from position `start` of the listing,
-- under today's bookkeeping: a record without `size` gets one (and the namespace's count
-- its bytes), and a closed one its place among the closed, by when it closed (read from its
-- document; now if that cannot be read), so that it expires like the others. Records
-- already adopted are left as they are, so running it twice, or on two processes at once,
-- counts nothing twice. KEYS: read_purge_keys; ARGV: read_adopt. Returns how many it looked at.
local k = read_purge_keys(KEYS, 1)
local a = read_adopt(ARGV, 1)
local start = tonumber(a.start)
local ids = redis.call('ZRANGE', k.all, start, start + tonumber(a.count) - 1)
local added = 0
for _, id in ipairs(ids) do
  local record = a.proposal_prefix .. id
  local stored = redis.call('HMGET', record, 'status', 'size')
  if stored[1] and not stored[2] then
    if stored[1] ~= 'pending' then  -- closed: what only an approval reads goes
      local ok, doc = pcall(cjson.decode, redis.call('HGET', record, 'doc') or '')
      local closed = ok and type(doc) == 'table' and tonumber(doc.decided_at) or
        tonumber(a.now)
      redis.call('HDEL', record, 'req')
      redis.call('ZADD', k.closed, closed, id)
    end
    local size = redis.call('HSTRLEN', record, 'doc') + redis.call('HSTRLEN', record, 'req')
    redis.call('HSET', record, 'size', size)
    added = added + size
  end
end
if added ~= 0 then
  redis.call('HINCRBY', k.usage, 'pbytes', added)
end
return #ids
