-- One delete: a tombstone version. KEYS: read_write_keys, read_gate_keys; ARGV: read_write
-- (its value, TTL and entry id unused), read_gate (rates only: a delete never grows usage).
local a, at = read_write(ARGV, 1)
local k, key_at = read_write_keys(KEYS, 1)
local ctx = write_context(k, a)
local first = replayed(ctx)
if first then
  return first
end
local now = tonumber(a.now)
local refused = admit(read_gate_keys(KEYS, key_at), read_gate(ARGV, at))
if refused then
  return answer(ctx, 'rate_limited', refused, false, true)
end

local current = load_entry(ctx.entry_key)
if current and is_expired(current, now) then
  current = expire_entry(ctx, current, now)
end
if not is_live(current, now) then
  return answer(ctx, 'not_found', {ver = current and current.ver or '0', del = '1'}, false)
end
if a.if_version ~= '' and current.ver ~= a.if_version then
  return answer(ctx, 'precondition_failed', current, true)
end
local verdict, ts = contest(current, a)
if verdict ~= 'ok' then
  return answer(ctx, verdict, current, true)
end

local tomb = {
  id = current.id, agent = a.agent, val = '', ver = tostring(tonumber(current.ver) + 1),
  ca = current.ca, ua = a.now, ts = ts, ttl = '', exp = '', del = '1', sv = '', cf = '',
  pr = a.priority
}
redis.call('ZREM', ctx.index_key, ctx.key)
redis.call('ZREM', ctx.ttl_key, ctx.key)
count_bytes(ctx, -value_size(ctx))
tomb.log_id = commit(ctx, tomb, 'delete')
return answer(ctx, 'ok', tomb, false)
