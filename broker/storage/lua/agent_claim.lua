-- Claim an agent name for one registering credential: registration by name is idempotent.
-- KEYS: read_claim_keys (the namespace's hash of claims, field `<registrar>\n<name>`, value the
--   agent id). ARGV: read_claim (the field, the agent id to claim it for, and the id of a
--   removed agent whose stale claim may be replaced, or '').
-- Returns the agent id that holds the claim: the one given, or the one that held it first.
local k = read_claim_keys(KEYS, 1)
local a = read_claim(ARGV, 1)
local current = redis.call('HGET', k.names, a.field)
if current and current ~= a.stale then
  return current
end
redis.call('HSET', k.names, a.field, a.id)
return a.id
