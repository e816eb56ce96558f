-- Helpers shared by the AMP read scripts. Values only ever arrive as KEYS/ARGV.

-- broker.grammar.glob_match, the same algorithm: `*` stands for any run of characters, everything
-- else for itself; the parts between stars are found leftmost-first, in linear time.
local function glob_match(glob, text)
  if not string.find(glob, '*', 1, true) then
    return glob == text
  end
  local parts = {}
  for part in string.gmatch(glob .. '*', '([^*]*)%*') do
    parts[#parts + 1] = part
  end
  local first, last = parts[1], parts[#parts]
  local tail = #text - #last + 1  -- where the last part must start
  if tail <= #first or string.sub(text, 1, #first) ~= first
      or string.sub(text, tail) ~= last then
    return false
  end
  local at = #first + 1
  for i = 2, #parts - 1 do
    local found = string.find(text, parts[i], at, true)
    if not found or found + #parts[i] > tail then
      return false
    end
    at = found + #parts[i]
  end
  return true
end

-- Count one read of a cell at `now`: access count, last access, the decay clock (never moved
-- back), and a recheck mark for a stale cell. Returns the new count.
local function touch(record_key, recheck_key, id, now, status)
  local count = redis.call('HINCRBY', record_key, 'count', 1)
  redis.call('HSET', record_key, 'accessed', now)
  if (tonumber(redis.call('HGET', record_key, 'ref') or '0') or 0) < tonumber(now) then
    redis.call('HSET', record_key, 'ref', now)
  end
  if status == 'stale' then
    redis.call('SADD', recheck_key, id)
  end
  return count
end
