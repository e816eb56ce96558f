-- Retention: drop up to `count` of the oldest audit records appended at or before `upto`,
-- remembering the hash and sequence of the newest dropped one, where verification starts.
-- KEYS: read_audit_keys; ARGV: read_trim. Returns how many it dropped.
local k = read_audit_keys(KEYS, 1)
local a = read_trim(ARGV, 1)
local old = drop_oldest(k.audit, a.upto, tonumber(a.count))
if #old == 0 then
  return 0
end
local last = old[#old][2]
local fields = {}
for i = 1, #last, 2 do
  fields[last[i]] = last[i + 1]
end
redis.call('HSET', k.meta, 'audit_anchor', fields.h or '',
           'audit_anchor_seq', tostring(cjson.decode(fields.r or '{}').seq or ''))
return #old
