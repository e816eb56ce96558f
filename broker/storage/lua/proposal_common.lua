-- Shared by propose.lua and proposal_decide.lua (needs audit.lua and common.lua before it).
-- A proposal's record (read_proposal_keys: record, all, due, closed) holds `status`, `doc`
-- (its wire JSON, made by the broker), `req` (what approval needs to write it; dropped once
-- decided), `by` (the proposer) and `size` (the bytes of `doc` and `req`, counted in the
-- namespace's usage `pbytes` against `max_bytes`; records of earlier releases have none and
-- count nothing until adopted, proposal_adopt.lua).

-- Move the namespace's proposal byte count by `delta`.
local function count_proposal_bytes(ctx, delta)
  if delta ~= 0 then
    redis.call('HINCRBY', ctx.usage_key, 'pbytes', delta)
  end
end

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
  local stored = redis.call('HMGET', pk.record, 'status', 'by', 'exp', 'size')
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
  -- Closed, the record keeps its new `doc` and drops `req`.
  local grows = #d.doc - (tonumber(stored[4]) or 0)
  if d.decision == 'approve' then
    ctx.approved_by, ctx.proposal, ctx.also_grows = d.decided_by, d.id, grows
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
  redis.call('HSET', pk.record, 'status', status, 'doc', d.doc, 'size', #d.doc)
  redis.call('HDEL', pk.record, 'req')
  redis.call('ZREM', pk.due, d.id)
  redis.call('ZADD', pk.closed, a.now, d.id)
  count_proposal_bytes(ctx, grows)
  proposal_event(ctx, status, d.decision, {id = d.id, by = stored[2], base = d.base, now = a.now,
                               version = version, details = d.details}, d.doc)
  return {'ok', written}
end
