-- Count the size of every value the namespace's index holds, in this one call, and mark the
-- count exact; the write scripts keep it exact from then on. KEYS: read_usage_keys;
-- ARGV: read_recount (the prefix of the namespace's entry keys, all in its slot).
local k = read_usage_keys(KEYS, 1)
local a = read_recount(ARGV, 1)
local total, start = 0, 0
while true do
  local names = redis.call('ZRANGE', k.index, start, start + 999)
  for _, name in ipairs(names) do
    total = total + redis.call('HSTRLEN', a.entry_prefix .. name, 'val')
  end
  if #names < 1000 then
    break
  end
  start = start + 1000
end
redis.call('HSET', k.usage, 'bytes', string.format('%d', total), 'counted', '1')
return total
