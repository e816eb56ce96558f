-- put(ctx, a): one write, with its arguments in table `a`:
--   key, now, new_id, agent, value, ts, ttl, exp, if_version, if_absent,
--   history_limit, log_maxlen, idem_window_ms, sv, cf, ts_from_client ('1' or '0'),
--   mode ('lww', 'priority' or 'merge'), writer priority, internal_cas ('1' when if_version
--   is the broker's own merge check: its failure is retried, so it is not remembered),
--   priority of entries written before priorities were set, the request's fingerprint
--   (read by write_context)
-- Returns the verdict, the entry to report (the one stored, for 'ok') and whether the reply
-- carries its value; for a message seen before, 'replay' and the first reply.
local function put(ctx, a)
  local first = replayed(ctx)
  if first then
    return 'replay', first
  end

  local now = tonumber(a[2])
  local agent = a[4]
  local ts = tonumber(a[6])
  local if_version = a[9]
  local if_absent = a[10] == '1'

  local mode = a[17]

  local current = load_entry(ctx.entry_key)
  if current and is_expired(current, now) then
    current = expire_entry(ctx, current, now)
  end
  local live = is_live(current, now)

  if if_absent and live then
    return 'precondition_failed', current, true
  end
  if if_version ~= '' and (not live or current.ver ~= if_version) then
    if live then
      return 'precondition_failed', current, true
    end
    return 'precondition_failed', {ver = current and current.ver or '0', del = '1'}, false
  end
  -- A write the broker stamped arrived after the stored one, so it sorts after it even when
  -- another broker process's clock runs ahead; a client's own timestamp is taken as given.
  local ts_text = a[6]
  local outranks = false
  if mode == 'priority' and current and current.ts ~= '' then
    local stored_priority = tonumber(current.pr) or tonumber(a[20])
    local priority = tonumber(a[18])
    if priority < stored_priority then
      return 'write_conflict', current, true
    end
    outranks = priority > stored_priority
  end
  if mode ~= 'merge' and not outranks and current and current.ts ~= '' then
    if a[16] == '1' then
      if loses_to(current, ts, agent) then
        return 'write_conflict', current, true
      end
    elseif ts <= tonumber(current.ts) then
      ts_text = string.format('%d', tonumber(current.ts) + 1)
    end
  end

  local entry = {
    id = live and current.id or a[3],
    agent = agent,
    val = a[5],
    ver = tostring(current and tonumber(current.ver) + 1 or 1),
    ca = live and current.ca or a[2],
    ua = a[2],
    ts = ts_text,
    ttl = a[7],
    exp = a[8],
    del = '',
    sv = a[14],
    cf = a[15],
    pr = a[18],
  }
  if not live then
    redis.call('ZADD', ctx.index_key, 0, ctx.key)  -- a live entry's key is there already
  end
  if entry.exp ~= '' then
    redis.call('ZADD', ctx.ttl_key, entry.exp, ctx.key)
  elseif live and current.exp ~= '' then
    redis.call('ZREM', ctx.ttl_key, ctx.key)
  end
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
  local forget = a[19] == '1' and status == 'precondition_failed'
  return answer(ctx, a[13], status, entry, with_value, forget)
end
