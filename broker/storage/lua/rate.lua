-- One read's rate check. KEYS: read_gate_keys; ARGV: read_clock, then read_gate (its quotas
-- unused). Returns {'ok'} or {'rate_limited', scope, retry_ms}.
local gk = read_gate_keys(KEYS, 1)
local c, at = read_clock(ARGV, 1)
local refused = admit(gk, read_gate(ARGV, at), tonumber(c.now))
if refused then
  return {'rate_limited', refused.scope, refused.retry_ms}
end
return {'ok'}
