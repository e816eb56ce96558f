-- AMP: read a cell and, when its index record lets the agent read it, count the read, in one
-- call. The broker still checks the cell itself and counts through amp_touch.lua when this did
-- not (a write not yet indexed, or a record written before records held readers).
-- KEYS: read_cell_read_keys (the cell's record, the recheck set). ARGV: read_cell_read (the
-- entry key prefix, the cell id, the reading agent, now (ms), then the record fields to return;
-- the first is the MEMP key).
-- Returns {} when the cell has no record, else {field values..., {entry field, value, ...},
-- new access count or -1 when the read was not counted}.
local k = read_cell_read_keys(KEYS, 1)
local a = read_cell_read(ARGV, 1)
local row = redis.call('HMGET', k.record, unpack(a.fields))
if not row[1] then
  return {}
end
local entry_key = a.entry_prefix .. row[1]
local entry = redis.call('HGETALL', entry_key)
local rule = redis.call('HMGET', k.record, 'status', 'readers', 'expires', 'ver')
local status, readers, expires, indexed = rule[1], rule[2], rule[3], rule[4]
local stored = redis.call('HMGET', entry_key, 'ver', 'del')
local count = -1
-- The record speaks for the entry only once the entry's latest write is indexed.
local visible = status ~= 'deleted' and indexed and indexed == stored[1] and stored[2] ~= '1'
    and (not expires or expires == '' or tonumber(expires) > tonumber(a.now))
if visible and readers then
  for glob in string.gmatch(readers, '%S+') do
    if glob_match(glob, a.agent) then
      count = touch(k.record, k.recheck, a.id, a.now, status)
      break
    end
  end
end
row[#a.fields + 1] = entry
row[#a.fields + 2] = count
return row
