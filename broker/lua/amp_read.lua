-- AMP: read a cell and, when its index record lets the agent read it, count the read, in one
-- call. The broker still checks the cell itself and counts through amp_touch.lua when this did
-- not (a write not yet indexed, or a record written before records held readers).
-- KEYS[1]: the cell's record; KEYS[2]: the recheck set.
-- ARGV[1]: the namespace's entry key prefix; ARGV[2]: the cell id; ARGV[3]: the reading agent;
-- ARGV[4]: now (ms); ARGV[5..]: the record fields to return (the first is the MEMP key).
-- Returns {} when the cell has no record, else {field values..., {entry field, value, ...},
-- new access count or -1 when the read was not counted}.
local fields = {unpack(ARGV, 5)}
local row = redis.call('HMGET', KEYS[1], unpack(fields))
if not row[1] then
  return {}
end
local entry_key = ARGV[1] .. row[1]
local entry = redis.call('HGETALL', entry_key)
local rule = redis.call('HMGET', KEYS[1], 'status', 'readers', 'expires', 'ver')
local status, readers, expires, indexed = rule[1], rule[2], rule[3], rule[4]
local stored = redis.call('HMGET', entry_key, 'ver', 'del')
local count = -1
-- The record speaks for the entry only once the entry's latest write is indexed.
local visible = status ~= 'deleted' and indexed and indexed == stored[1] and stored[2] ~= '1'
    and (not expires or expires == '' or tonumber(expires) > tonumber(ARGV[4]))
if visible and readers then
  for glob in string.gmatch(readers, '%S+') do
    if glob_match(glob, ARGV[3]) then
      count = touch(KEYS[1], KEYS[2], ARGV[2], ARGV[4], status)
      break
    end
  end
end
row[#fields + 1] = entry
row[#fields + 2] = count
return row
