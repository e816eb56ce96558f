-- Expire due entries. KEYS: read_namespace_keys, then read_entry_keys per candidate.
-- ARGV: read_expire (now, limits, the candidates' names in KEYS order).
-- Safe when several broker processes sweep at once: an entry is only expired while still due.
local ns, at = read_namespace_keys(KEYS, 1)
local a = read_expire(ARGV, 1)
local now = tonumber(a.now)
local expired = 0
for _, name in ipairs(a.names) do
  local e
  e, at = read_entry_keys(KEYS, at)
  local ctx = write_context(
    {entry = e.entry, history = e.history, index = ns.index, ttl = ns.ttl, log = ns.log,
     idem = '', meta = ns.meta, audit = ns.audit, usage = ns.usage},
    {key = name, history_limit = a.history_limit, log_maxlen = a.log_maxlen})
  local readable, entry = pcall(load_entry, ctx.entry_key)
  if not readable then  -- corrupt: never expired, and no longer in the way of the others
    redis.call('ZREM', ctx.ttl_key, ctx.key)
  elseif entry and is_expired(entry, now) then
    expire_entry(ctx, entry, now)
    expired = expired + 1
  elseif not entry or entry.exp == '' or entry.del == '1' then
    redis.call('ZREM', ctx.ttl_key, ctx.key)
  end
end
return expired
