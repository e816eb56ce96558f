-- Count the size of every value the namespace's index holds and of every proposal it keeps
-- (their `size` fields), in this one call, and mark the count exact; the write and proposal
-- scripts keep it exact from then on. KEYS: read_usage_keys; ARGV: read_recount (the prefixes
-- of the namespace's entry and proposal keys, all in its slot).
local k = read_usage_keys(KEYS, 1)
local a = read_recount(ARGV, 1)

-- The sum of `field(prefix .. member)` over the members of the sorted set `set`.
local function total_over(set, prefix, field)
  local total, start = 0, 0
  while true do
    local names = redis.call('ZRANGE', set, start, start + 999)
    for _, name in ipairs(names) do
      total = total + field(prefix .. name)
    end
    if #names < 1000 then
      return total
    end
    start = start + 1000
  end
end

local values = total_over(k.index, a.entry_prefix, function(key)
  return redis.call('HSTRLEN', key, 'val')
end)
local proposals = total_over(k.proposals, a.proposal_prefix, function(key)
  return tonumber(redis.call('HGET', key, 'size')) or 0
end)
redis.call('HSET', k.usage, 'bytes', string.format('%d', values),
           'pbytes', string.format('%d', proposals), 'counted', '1')
return values
