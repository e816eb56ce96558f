-- Append one audit record that no entry write carries (configuration, schemas, keys, shares,
-- erasure receipts). KEYS: read_audit_keys; ARGV: read_audit_add (name/value pairs).
local k = read_audit_keys(KEYS, 1)
local a = read_audit_add(ARGV, 1)
local rec = {}
for i = 1, #a.pairs, 2 do
  rec[a.pairs[i]] = a.pairs[i + 1]
end
return audit_append(k.audit, k.meta, rec)
