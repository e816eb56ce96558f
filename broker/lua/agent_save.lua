-- Register an agent: its hash, and its place in the namespace's registration order.
-- KEYS[1]: the agent's hash; KEYS[2]: the namespace's agents index (members `<ms>:<id>`, all
--   scored 0, so they sort by registration time, then id).
-- ARGV: id, name, framework, namespace, created_at (ms).
-- An agent registered in the same millisecond as the latest one, or before it by another
-- process's clock, is stamped a millisecond after it, so listings keep registration order.
-- Returns the created_at stored.
local created = tonumber(ARGV[5])
local latest = redis.call('ZREVRANGEBYLEX', KEYS[2], '+', '-', 'LIMIT', 0, 1)[1]
local latest_ms = latest and tonumber(string.sub(latest, 1, 13))
if latest_ms and latest_ms >= created then
  created = latest_ms + 1
end
local stamp = string.format('%d', created)
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'name', ARGV[2], 'framework', ARGV[3],
           'namespace', ARGV[4], 'created_at', stamp, 'last_seen', stamp)
redis.call('ZADD', KEYS[2], 0, string.format('%013d', created) .. ':' .. ARGV[1])
return created
