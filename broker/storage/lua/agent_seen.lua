-- Raise agents' `last_seen` (never lower it). KEYS: the agents' hashes; ARGV: read_seen per
-- agent, in KEYS order. An agent removed meanwhile is left removed.
local at = 1
for _, agent_key in ipairs(KEYS) do
  local a
  a, at = read_seen(ARGV, at)
  if redis.call('EXISTS', agent_key) == 1 then
    local seen = tonumber(redis.call('HGET', agent_key, 'last_seen') or '0')
    if tonumber(a.when) > seen then
      redis.call('HSET', agent_key, 'last_seen', a.when)
    end
  end
end
return 0
