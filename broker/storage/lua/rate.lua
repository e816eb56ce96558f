-- One read's rate check. KEYS: read_gate_keys; ARGV: read_gate (its quotas unused).
-- Returns {'ok'} or {'rate_limited', scope, retry_ms}.
local refused = admit(read_gate_keys(KEYS, 1), read_gate(ARGV, 1))
if refused then
  return {'rate_limited', refused.scope, refused.retry_ms}
end
return {'ok'}
