-- The audit log (docs/governance.md): one append-only record per mutation or governance event,
-- per namespace, each carrying the hash of the one before it. `rec` holds strings only; the
-- record is stored as the exact JSON that was hashed, so verification rehashes stored bytes.
-- Empty fields are left out. Needs sha1.lua before it. A script appending many records may
-- hold the chain's head in `chain` (start with {}): it is read on first use and kept there,
-- and audit_flush stores it once, at the end; without `chain` each append stores it.
local function audit_append(audit_key, meta_key, rec, chain)
  for name, value in pairs(rec) do
    if value == '' then rec[name] = nil end
  end
  local held = chain ~= nil
  if not (held and chain.seq) then
    local head = redis.call('HMGET', meta_key, 'audit_head', 'audit_seq')
    chain = chain or {}
    chain.head, chain.seq = head[1] or '', tonumber(head[2]) or 0
  end
  rec.seq = tostring(chain.seq + 1)
  rec.prev = chain.head
  local body = cjson.encode(rec)
  local hash = sha1hex(body)
  redis.call('XADD', audit_key, '*', 'r', body, 'h', hash)
  chain.head, chain.seq = hash, chain.seq + 1
  if held then
    chain.moved = true
  else
    redis.call('HSET', meta_key, 'audit_head', hash, 'audit_seq', rec.seq)
  end
  return hash
end

-- Store the head a held chain reached, if it moved.
local function audit_flush(meta_key, chain)
  if chain.moved then
    redis.call('HSET', meta_key, 'audit_head', chain.head, 'audit_seq', tostring(chain.seq))
    chain.moved = false
  end
end

-- The conflicting paths of a merge, never their values (the audit log holds no content).
local function conflict_paths(cf)
  if cf == nil or cf == '' then
    return ''
  end
  local paths = {}
  for _, c in ipairs(cjson.decode(cf)) do
    paths[#paths + 1] = c.path
  end
  return cjson.encode(paths)
end

-- The audit record of one committed entry version (a put, delete, expiry or merge).
local function audit_entry(ctx, entry, change_type)
  if not ctx.audit_key or ctx.audit_key == '' then
    return
  end
  local action = change_type
  if change_type == 'put' and ctx.action and ctx.action ~= '' then
    action = ctx.action  -- named by the writer: an AMP cell's create, patch or transition
  elseif change_type == 'put' and ctx.mode == 'merge' then
    action = 'merge'
  end
  local ver = tonumber(entry.ver)
  audit_append(ctx.audit_key, ctx.meta_key, {
    at = entry.ua, action = action, key = ctx.key, actor = ctx.actor or 'system',
    agent_id = change_type == 'expire' and '' or entry.agent, key_id = ctx.key_id or '',
    request_id = ctx.request_id or '', version_before = tostring(ver - 1),
    version_after = tostring(ver),
    content_hash = entry.val ~= '' and ctx.content_hash or '',
    conflicts = conflict_paths(entry.cf), proposal = ctx.proposal or '',
    approved_by = ctx.approved_by or ''
  }, ctx.audit_chain)
end
