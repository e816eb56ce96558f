-- open_write(ctx, now): how put and delete begin. A message seen before gets its first reply
-- and a write over its gate's rates is refused, each as a table of the reply's parts; otherwise
-- nil and the current entry (expired first when its time has come).
local function open_write(ctx, now)
  local first = replayed(ctx)
  if first then
    return {'replay', first}
  end
  if ctx.gate then
    local refused = admit(ctx.gate_keys, ctx.gate)
    if refused then
      return {'rate_limited', refused, false}
    end
  end
  local current = load_entry(ctx.entry_key)
  if current and is_expired(current, now) then
    current = expire_entry(ctx, current, now)
  end
  return nil, current
end

-- put(ctx, a): one write, its arguments `a` read with read_write (broker/storage/entries.py,
-- WRITE). Returns the verdict, the entry to report (the one stored, for 'ok') and whether the
-- reply carries its value; for a message seen before, 'replay' and the first reply. With a
-- gate (ctx.gate, ctx.gate_keys: gate.lua) the write is also held to its rates and quotas.
local function put(ctx, a)
  local now = tonumber(a.now)
  local early, current = open_write(ctx, now)
  if early then
    return unpack(early)
  end
  local live = is_live(current, now)

  if a.if_absent == '1' and live then
    return 'precondition_failed', current, true
  end
  if a.if_version ~= '' and (not live or current.ver ~= a.if_version) then
    if live then
      return 'precondition_failed', current, true
    end
    return 'precondition_failed', {ver = current and current.ver or '0', del = '1'}, false
  end
  local verdict, ts = contest(current, a)
  if verdict ~= 'ok' then
    return verdict, current, true
  end
  local old_size = live and value_size(ctx) or 0
  if ctx.gate then
    -- An approval also rewrites its proposal's record (proposal_common.lua): what that
    -- adds or frees counts with the value.
    local over = over_quota(ctx, ctx.gate, not live, #a.value - old_size + (ctx.also_grows or 0))
    if over == 'uncounted' then
      return 'uncounted', {}, false
    elseif over then
      return 'quota_exceeded', over, false
    end
  end

  local entry = {
    id = live and current.id or a.entry_id,
    agent = a.agent,
    val = a.value,
    ver = tostring(current and tonumber(current.ver) + 1 or 1),
    ca = live and current.ca or a.now,
    ua = a.now,
    ts = ts,
    ttl = a.ttl,
    exp = a.exp,
    del = '',
    sv = a.schema_errors,
    cf = a.conflicts,
    pr = a.priority,
    apb = ctx.approved_by or '',  -- set by an approval (proposal_decide.lua)
    pid = ctx.proposal or '',
  }
  if not live then
    redis.call('ZADD', ctx.index_key, 0, ctx.key)  -- a live entry's key is there already
  end
  if entry.exp ~= '' then
    redis.call('ZADD', ctx.ttl_key, entry.exp, ctx.key)
  elseif live and current.exp ~= '' then
    redis.call('ZREM', ctx.ttl_key, ctx.key)
  end
  count_bytes(ctx, #a.value - old_size)
  entry.log_id = commit(ctx, entry, 'put')
  entry.created = live and '' or '1'
  return 'ok', entry, false
end

-- The reply to a put (see answer). A failed compare-and-set of the broker's own is not
-- remembered under the message id: the broker retries it.
local function put_reply(ctx, a, status, entry, with_value)
  if status == 'replay' then
    return entry
  end
  local forget = (a.internal_cas == '1' and status == 'precondition_failed') or REFUSED[status]
  return answer(ctx, status, entry, with_value, forget)
end
