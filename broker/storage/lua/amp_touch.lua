-- AMP: count reads of cells (every read waiting at the time shares this one call).
-- KEYS: read_cell_touch_keys (the recheck set, then the cells' record hashes).
-- ARGV: read_cell_touch per cell, in KEYS order (its id and the read's time, ms).
-- Returns each cell's new access count, or -1 where the cell is gone or deleted.
local k = read_cell_touch_keys(KEYS, 1)
local counts = {}
local at = 1
for i, record in ipairs(k.records) do
  local a
  a, at = read_cell_touch(ARGV, at)
  local status = redis.call('HGET', record, 'status')
  if status and status ~= 'deleted' then
    counts[i] = touch(record, k.recheck, a.id, a.now, status)
  else
    counts[i] = -1
  end
end
return counts
