-- Expire due entries. KEYS: index, ttl, log, meta, then (entry, history) per candidate key.
-- ARGV: now, history_limit, log_maxlen, then the candidate keys in the same order.
-- Safe when several broker processes sweep at once: an entry is only expired while still due.
local now = tonumber(ARGV[1])
local expired = 0
local candidates = #ARGV - 3
for i = 1, candidates do
  local ctx = write_context({KEYS[4 + 2 * i - 1], KEYS[4 + 2 * i], KEYS[1], KEYS[2], KEYS[3],
                             '', KEYS[4]}, ARGV[3 + i], ARGV[2], ARGV[3])
  local entry = load_entry(ctx.entry_key)
  if entry and is_expired(entry, now) then
    expire_entry(ctx, entry, now)
    expired = expired + 1
  elseif not entry or entry.exp == '' or entry.del == '1' then
    redis.call('ZREM', ctx.ttl_key, ctx.key)
  end
end
return expired
