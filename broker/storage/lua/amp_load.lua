-- AMP: cells' index records and their MEMP entries, in one call.
-- KEYS: the cells' record hashes. ARGV: read_cell_load (the namespace's entry key prefix, then
-- the record fields to return; the first is the cell's MEMP key).
-- Returns per cell {field values..., {entry field, value, ...}}, or {} when it has no record.
local a = read_cell_load(ARGV, 1)
local out = {}
for i, record_key in ipairs(KEYS) do
  local row = redis.call('HMGET', record_key, unpack(a.fields))
  if row[1] then
    row[#a.fields + 1] = redis.call('HGETALL', a.entry_prefix .. row[1])
    out[i] = row
  else
    out[i] = {}
  end
end
return out
