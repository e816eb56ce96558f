-- AMP: count reads of cells (every read waiting at the time shares this one call).
-- KEYS[1]: the recheck set; KEYS[2..]: the cells' record hashes.
-- ARGV: per cell, in KEYS order, its id and the read's time (ms).
-- Returns each cell's new access count, or -1 where the cell is gone or deleted.
local counts = {}
for i = 2, #KEYS do
  local status = redis.call('HGET', KEYS[i], 'status')
  if status and status ~= 'deleted' then
    counts[i - 1] = touch(KEYS[i], KEYS[1], ARGV[2 * i - 3], ARGV[2 * i - 2], status)
  else
    counts[i - 1] = -1
  end
end
return counts
