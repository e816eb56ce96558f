-- Drop up to `count` closed proposals that closed at or before `before` (ms): their records,
-- their places in the listing, and their bytes from the namespace's count. One call, so two
-- processes sweeping at once drop (and uncount) each proposal once. The audit log keeps its
-- records of them. KEYS: read_purge_keys; ARGV: read_purge. Returns how many it dropped.
local k = read_purge_keys(KEYS, 1)
local a = read_purge(ARGV, 1)
local ids = redis.call('ZRANGEBYSCORE', k.closed, '-inf', a.before, 'LIMIT', 0,
                       tonumber(a.count))
local freed = 0
for _, id in ipairs(ids) do
  local record = a.proposal_prefix .. id
  freed = freed + (tonumber(redis.call('HGET', record, 'size')) or 0)
  redis.call('DEL', record)
  redis.call('ZREM', k.all, id)
  redis.call('ZREM', k.closed, id)
end
if freed ~= 0 then
  redis.call('HINCRBY', k.usage, 'pbytes', -freed)
end
return #ids
