-- AMP: count reads of cells (every read waiting at the time shares this one call).
-- KEYS[1]: the recheck set; KEYS[2..]: the cells' record hashes.
-- ARGV: per cell, in KEYS order, its id and the read's time (ms).
-- A read restarts the decay clock; a stale cell is marked for the engine's next run.
-- Returns each cell's new access count, or -1 where the cell is gone or deleted.
local counts = {}
for i = 2, #KEYS do
  local id, now = ARGV[2 * i - 3], ARGV[2 * i - 2]
  local status = redis.call('HGET', KEYS[i], 'status')
  if status and status ~= 'deleted' then
    counts[i - 1] = redis.call('HINCRBY', KEYS[i], 'count', 1)
    redis.call('HSET', KEYS[i], 'accessed', now)
    if tonumber(redis.call('HGET', KEYS[i], 'ref') or '0') < tonumber(now) then
      redis.call('HSET', KEYS[i], 'ref', now)
    end
    if status == 'stale' then
      redis.call('SADD', KEYS[1], id)
    end
  else
    counts[i - 1] = -1
  end
end
return counts
