-- One read's rate check, and the read itself when it is one entry's (a get: one round trip).
-- KEYS: read_gate_keys, read_rate_read_keys (the entry to read; none for a query page or a
-- history read); ARGV: read_gate (its quotas unused).
-- Returns {'ok'}, {'ok', the entry's fields (HGETALL)} or {'rate_limited', scope, retry_ms}.
local gk, key_at = read_gate_keys(KEYS, 1)
local k = read_rate_read_keys(KEYS, key_at)
local refused = admit(gk, read_gate(ARGV, 1))
if refused then
  return {'rate_limited', refused.scope, refused.retry_ms}
end
if k.entry[1] then
  return {'ok', redis.call('HGETALL', k.entry[1])}
end
return {'ok'}
