-- Record a gated write as a pending proposal, if the key still holds the version it was made
-- against. KEYS: read_write_keys, read_proposal_keys, read_gate_keys. ARGV: read_write (who,
-- the message id and its fingerprint), read_propose, read_gate (its rates: a proposal takes
-- the write's tokens, and its `max_bytes`: a proposal is stored data). Returns {'proposed',
-- id}, {'moved', version}, {'refused', the encoded refusal: rate_limited, or quota_exceeded
-- for max_pending_proposals or max_bytes}, {'uncounted', ''} (count the namespace's bytes,
-- usage_count.lua, then call again), or a replay of the first reply to the message id.
local k, key_at = read_write_keys(KEYS, 1)
local pk
pk, key_at = read_proposal_keys(KEYS, key_at)
local gk = read_gate_keys(KEYS, key_at)
local a, at = read_write(ARGV, 1)
local p
p, at = read_propose(ARGV, at)
local g = read_gate(ARGV, at)
local ctx = write_context(k, a)
local first = replayed(ctx)
if first then
  return first
end
local refused = admit(gk, g)
if refused then
  return {'refused', cjson.encode({'rate_limited', refused})}
end
local now = tonumber(a.now)
local current = load_entry(ctx.entry_key)
local version = is_live(current, now) and current.ver or '0'
if version ~= p.base then
  return {'moved', version}
end
if p.max_pending ~= '' then  -- pending proposals past their time are not counted
  local pending = redis.call('ZCOUNT', pk.due, '(' .. a.now, '+inf')
  if pending >= tonumber(p.max_pending) then
    return {'refused', cjson.encode({'quota_exceeded', {limit = 'max_pending_proposals',
      max = p.max_pending, used = int(pending), requested = '1'}})}
  end
end
local size = #p.doc + #p.req
local over = over_quota(ctx, g, false, size)
if over == 'uncounted' then
  return {'uncounted', ''}
elseif over then
  return {'refused', cjson.encode({'quota_exceeded', over})}
end
redis.call('HSET', pk.record, 'status', 'pending', 'doc', p.doc, 'req', p.req, 'by', p.by,
           'exp', p.expires, 'key', ctx.key, 'size', size)
count_proposal_bytes(ctx, size)
redis.call('ZADD', pk.all, p.created, p.id)
redis.call('ZADD', pk.due, p.expires, p.id)
proposal_event(ctx, 'proposal', 'propose', {id = p.id, by = p.by, agent = a.agent, base = p.base,
                                 now = a.now, content_hash = a.content_hash}, p.doc)
local reply = cjson.encode({'proposed', {id = p.id}})
if ctx.idem_key ~= '' then
  redis.call('SET', ctx.idem_key, ctx.fingerprint .. '\n' .. reply, 'PX', ctx.idem_window_ms)
end
return {'ok', reply}
