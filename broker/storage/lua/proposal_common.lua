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
