-- AMP: cells' index records and their MEMP entries, in one call.
-- KEYS: the cells' record hashes. ARGV[1]: the namespace's entry key prefix; ARGV[2..]: the
-- record fields to return (the first is the cell's MEMP key).
-- Returns per cell {field values..., {entry field, value, ...}}, or {} when it has no record.
local fields = {unpack(ARGV, 2)}
local out = {}
for i, record_key in ipairs(KEYS) do
  local row = redis.call('HMGET', record_key, unpack(fields))
  if row[1] then
    row[#fields + 1] = redis.call('HGETALL', ARGV[1] .. row[1])
    out[i] = row
  else
    out[i] = {}
  end
end
return out
