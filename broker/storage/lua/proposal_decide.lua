-- Approve, reject or expire a pending proposal. KEYS: read_write_keys, read_proposal_keys.
-- ARGV: read_write (for an approval, the write itself, conditioned on the proposal's base
-- version), read_decide. Returns {'ok', the written entry's verdict or ''}, {'decided',
-- status}, {'missing', ''}, {'early', ''} (not yet due to expire), or the write's own failed
-- verdict ('precondition_failed': the key moved; 'write_conflict'), with nothing changed.
local k, key_at = read_write_keys(KEYS, 1)
local pk = read_proposal_keys(KEYS, key_at)
local a, at = read_write(ARGV, 1)
local d = read_decide(ARGV, at)
local ctx = write_context(k, a)
local stored = redis.call('HMGET', pk.record, 'status', 'by', 'exp')
if not stored[1] then
  return {'missing', ''}
end
if stored[1] ~= 'pending' then
  return {'decided', stored[1]}
end
local now = tonumber(a.now)
if d.decision == 'expire' and tonumber(stored[3]) > now then
  return {'early', ''}
end
local written = ''
local version = ''
if d.decision == 'approve' then
  ctx.approved_by, ctx.proposal = d.decided_by, d.id
  local status, entry, with_value
  if d.operation == 'delete' then
    status, entry, with_value = delete(ctx, a)
  else
    status, entry, with_value = put(ctx, a)
  end
  if status ~= 'ok' then
    return answer(ctx, status, entry, with_value, true)
  end
  written = answer(ctx, status, entry, false, true)[2]
  version = entry.ver
end
local status = d.decision == 'approve' and 'approved' or
  (d.decision == 'reject' and 'rejected' or 'expired')
redis.call('HSET', pk.record, 'status', status, 'doc', d.doc)
redis.call('ZREM', pk.due, d.id)
proposal_event(ctx, status, d.decision, {id = d.id, by = stored[2], base = d.base, now = a.now,
                             version = version, details = d.details}, d.doc)
return {'ok', written}
