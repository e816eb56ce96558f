-- delete(ctx, a): one delete, a tombstone version; its arguments `a` read with read_write (its
-- value, TTL and entry id unused). Returns the verdict, the entry to report and whether the
-- reply carries its value, as put() does; for a message seen before, 'replay' and the reply.
-- With a gate (ctx.gate, ctx.gate_keys: gate.lua) it is held to its rates (a delete never
-- grows usage).
local function delete(ctx, a)
  local now = tonumber(a.now)
  local early, current = open_write(ctx, now)
  if early then
    return unpack(early)
  end
  if not is_live(current, now) then
    return 'not_found', {ver = current and current.ver or '0', del = '1'}, false
  end
  if a.if_version ~= '' and current.ver ~= a.if_version then
    return 'precondition_failed', current, true
  end
  local verdict, ts = contest(current, a)
  if verdict ~= 'ok' then
    return verdict, current, true
  end
  local tomb = {
    id = current.id, agent = a.agent, val = '', ver = tostring(tonumber(current.ver) + 1),
    ca = current.ca, ua = a.now, ts = ts, ttl = '', exp = '', del = '1', sv = '', cf = '',
    pr = a.priority, apb = ctx.approved_by or '', pid = ctx.proposal or ''
  }
  redis.call('ZREM', ctx.index_key, ctx.key)
  redis.call('ZREM', ctx.ttl_key, ctx.key)
  count_bytes(ctx, -value_size(ctx))
  tomb.log_id = commit(ctx, tomb, 'delete')
  return 'ok', tomb, false
end
