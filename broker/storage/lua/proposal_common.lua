-- Shared by propose.lua and proposal_decide.lua (needs audit.lua and common.lua before it).
-- A proposal's record (read_proposal_keys: record, all, due) holds `status`, `doc` (its wire
-- JSON, made by the broker), `req` (what approval needs to write it) and `by` (the proposer).

-- Announce a proposal change to subscribers (who may see it is decided by the broker: the
-- proposer and holders of `review`) and append its audit record.
local function proposal_event(ctx, kind, action, p, doc)
  redis.call('XADD', ctx.log_key, '*', 'type', kind, 'key', ctx.key, 'pid', p.id, 'by', p.by,
             'doc', doc)
  if not ctx.trim_later then
    trim_excess(ctx.log_key, ctx.meta_key, ctx.log_maxlen)
  end
  audit_append(ctx.audit_key, ctx.meta_key, {
    at = p.now, action = action,
    key = ctx.key, actor = ctx.actor, agent_id = p.agent or '', key_id = ctx.key_id,
    request_id = ctx.request_id, proposal = p.id, version_before = p.base,
    version_after = p.version or '', content_hash = p.content_hash or '',
    details = p.details or ''
  })
end

-- Approve (writing `a`, then `after_write(entry)` if given), reject or expire the pending
-- proposal `d` names: see proposal_decide.lua for the replies.
local function decide_proposal(ctx, a, d, pk, after_write)
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
    if after_write then
      after_write(entry)
    end
  end
  local status = d.decision == 'approve' and 'approved' or
    (d.decision == 'reject' and 'rejected' or 'expired')
  redis.call('HSET', pk.record, 'status', status, 'doc', d.doc)
  redis.call('ZREM', pk.due, d.id)
  proposal_event(ctx, status, d.decision, {id = d.id, by = stored[2], base = d.base, now = a.now,
                               version = version, details = d.details}, d.doc)
  return {'ok', written}
end
