-- Register an agent: its hash, and its place in the namespace's registration order.
-- KEYS: read_agent_keys (the agent's hash; the namespace's agents index, members `<ms>:<id>`,
--   all scored 0, so they sort by registration time, then id). ARGV: read_agent.
-- An agent registered in the same millisecond as the latest one, or before it by another
-- process's clock, is stamped a millisecond after it, so listings keep registration order.
-- Returns the created_at stored. An agent already stored (its registration run again after a
-- failure) is left as it is.
local k = read_agent_keys(KEYS, 1)
local a = read_agent(ARGV, 1)
local stored = redis.call('HGET', k.agent, 'created_at')
if stored then
  return tonumber(stored)
end
local created = tonumber(a.created_at)
local latest = redis.call('ZREVRANGEBYLEX', k.index, '+', '-', 'LIMIT', 0, 1)[1]
local latest_ms = latest and tonumber(string.sub(latest, 1, 13))
if latest_ms and latest_ms >= created then
  created = latest_ms + 1
end
local stamp = string.format('%d', created)
redis.call('HSET', k.agent, 'id', a.id, 'name', a.name, 'framework', a.framework,
           'namespace', a.namespace, 'created_at', stamp, 'last_seen', stamp)
redis.call('ZADD', k.index, 0, string.format('%013d', created) .. ':' .. a.id)
return created
