-- Shared helpers of the write scripts. Values only ever arrive as KEYS/ARGV, read through the
-- generated readers (`read_<block>`, broker/storage/scripts.py); FIELDS and META, the entry's
-- stored field names, are generated too (broker/storage/records.py). Needs stream.lua.

-- The numeric fields of an entry hash; a write reads them as numbers.
local NUMERIC = {'ver', 'ca', 'ua', 'ts', 'ttl', 'exp', 'pr'}

-- The entry stored under `entry_key` (nil for none). One that cannot be read (not a hash, a
-- numeric field that is not a number) raises a `CORRUPT` error naming it, which the broker
-- answers with `corrupt_record`, rather than a script error half way through a write.
local function load_entry(entry_key)
  local values = redis.pcall('HMGET', entry_key, unpack(META))
  if values.err then
    error({err = 'CORRUPT ' .. entry_key .. ' is not a hash'})
  end
  if not values[3] then
    return nil
  end
  local entry = {}
  for i, name in ipairs(META) do
    entry[name] = values[i] or ''
  end
  for _, name in ipairs(NUMERIC) do
    if entry[name] ~= '' and not tonumber(entry[name]) then
      error({err = 'CORRUPT ' .. entry_key .. ': field ' .. name .. ' is not a number'})
    end
  end
  if string.find(entry.id, '[^ -~]') then  -- a write keeps it: it must stay readable
    error({err = 'CORRUPT ' .. entry_key .. ': field id is not printable ASCII'})
  end
  return entry
end

local function is_expired(entry, now)
  return entry.del ~= '1' and entry.exp ~= '' and tonumber(entry.exp) <= now
end

local function is_live(entry, now)
  return entry ~= nil and entry.del ~= '1' and not is_expired(entry, now)
end

local function flatten(entry)
  local out = {}
  for _, name in ipairs(FIELDS) do
    out[#out + 1] = name
    out[#out + 1] = entry[name] or ''
  end
  return out
end

-- Drop up to `count` of the oldest change-log records, none logged after position `upto`
-- ('+' for any), and remember the newest dropped id: a cursor before it has lost changes (a
-- `reset`). The one way records leave the log; returns how many it dropped.
local function trim_log(log_key, meta_key, upto, count)
  local old = drop_oldest(log_key, upto, count)
  if #old > 0 then
    redis.call('HSET', meta_key, 'trimmed', old[#old][1])
  end
  return #old
end

-- Keep the log at about `maxlen` records: trim in steps of about 1%, so most writes skip it.
local function trim_excess(log_key, meta_key, maxlen)
  local excess = redis.call('XLEN', log_key) - maxlen
  if excess > 0 and excess >= math.max(1, math.floor(maxlen / 100)) then
    trim_log(log_key, meta_key, '+', math.min(excess, 1000))
  end
end

-- A write's context: its keys (read_write_keys: entry, history, index, ttl, log, idem (its
-- message id's reply; unused unless `remember` is '1'), meta, usage, audit), the entry's name,
-- the limits, the fingerprint of the request behind the message id, and who acts (for the
-- audit).
local function write_context(k, a)
  return {
    entry_key = k.entry, history_key = k.history, index_key = k.index, ttl_key = k.ttl,
    log_key = k.log, idem_key = a.remember == '1' and k.idem or '', meta_key = k.meta,
    usage_key = k.usage,
    key = a.key,
    history_limit = tonumber(a.history_limit), log_maxlen = tonumber(a.log_maxlen),
    idem_window_ms = a.idem_window_ms, fingerprint = a.fingerprint or '',
    audit_key = k.audit, actor = a.actor, key_id = a.key_id, request_id = a.request_id,
    content_hash = a.content_hash, mode = a.mode, action = a.action
  }
end

-- The size of the stored value (0 for a tombstone), and the namespace's byte count moved by
-- `delta`: every write, delete and expiry keeps it, so quotas read it without a scan.
local function value_size(ctx)
  return redis.call('HSTRLEN', ctx.entry_key, 'val')
end

local function count_bytes(ctx, delta)
  if delta ~= 0 then
    redis.call('HINCRBY', ctx.usage_key, 'bytes', delta)
  end
end

-- Store a new version: entry hash, history, and one change-log record, all in this call.
-- `changed`, when given, names the only fields that differ from the stored hash (an AMP status
-- change: amp_status.lua), so only they are written. A tombstone's record keeps the value it
-- removed (`was`), so a subscription filter on values can match the delete or expiry.
local function commit(ctx, entry, change_type, changed)
  local removed = entry.del == '1' and redis.call('HGET', ctx.entry_key, 'val') or ''
  if changed then
    local out = {}
    for _, name in ipairs(changed) do
      out[#out + 1] = name
      out[#out + 1] = entry[name]
    end
    redis.call('HSET', ctx.entry_key, unpack(out))
  else
    redis.call('HSET', ctx.entry_key, unpack(flatten(entry)))
  end
  if ctx.history_limit > 0 then
    if redis.call('LPUSH', ctx.history_key, cjson.encode(entry)) > ctx.history_limit then
      redis.call('LTRIM', ctx.history_key, 0, ctx.history_limit - 1)
    end
  else
    redis.call('DEL', ctx.history_key)
  end
  local record = {'type', change_type, 'key', ctx.key}
  for _, name in ipairs(FIELDS) do
    if entry[name] ~= '' and name ~= 'del' then
      record[#record + 1] = name
      record[#record + 1] = entry[name]
    end
  end
  if removed and removed ~= '' then
    record[#record + 1] = 'was'
    record[#record + 1] = removed
  end
  local id = redis.call('XADD', ctx.log_key, '*', unpack(record))
  audit_entry(ctx, entry, change_type)
  if not ctx.trim_later then  -- a script of many writes trims once, at the end
    trim_excess(ctx.log_key, ctx.meta_key, ctx.log_maxlen)
  end
  return id
end

-- Turn a due entry into a tombstone with its own version and an `expire` change. Expiry is
-- not a write, so the tombstone has no timestamp and any later write may follow it.
local function expire_entry(ctx, entry, now)
  local tomb = {
    id = entry.id, agent = entry.agent, val = '', ver = tostring(tonumber(entry.ver) + 1),
    ca = entry.ca, ua = string.format('%d', now), ts = '', ttl = '', exp = '', del = '1',
    sv = '', cf = '', pr = ''
  }
  redis.call('ZREM', ctx.index_key, ctx.key)
  redis.call('ZREM', ctx.ttl_key, ctx.key)
  count_bytes(ctx, -value_size(ctx))
  commit(ctx, tomb, 'expire')
  return tomb
end

-- Last-write-wins order: (timestamp, agent id); a write that sorts before the stored one loses.
local function loses_to(entry, ts, agent)
  local stored_ts = tonumber(entry.ts) or 0
  if ts ~= stored_ts then
    return ts < stored_ts
  end
  return agent < entry.agent
end

-- The strategy's decision, for puts and deletes alike (read_write): may write `a` replace the
-- stored version `current` (live or a tombstone)? Returns 'ok' and the timestamp to store, or
-- 'write_conflict'. Agent priority first: a lower priority loses, a higher one wins outright.
-- Then last-write-wins (merge combines writes instead): a client's timestamp is taken as given;
-- a write the broker stamped arrived after the stored one, so it sorts after it even when
-- another broker process's clock runs ahead.
local function contest(current, a)
  if not current or current.ts == '' then
    return 'ok', a.ts
  end
  local outranks = false
  if a.mode == 'priority' then
    local stored = tonumber(current.pr) or tonumber(a.default_priority)
    local mine = tonumber(a.priority)
    if mine < stored then
      return 'write_conflict'
    end
    outranks = mine > stored
  end
  if a.mode == 'merge' or outranks then
    return 'ok', a.ts
  end
  local ts = tonumber(a.ts)
  if a.ts_from_client == '1' then
    if loses_to(current, ts, a.agent) then
      return 'write_conflict'
    end
  elseif ts <= tonumber(current.ts) then
    return 'ok', string.format('%d', tonumber(current.ts) + 1)
  end
  return 'ok', a.ts
end

-- The first reply to this message id, if it was seen within the window: {'replay', reply}, or
-- {'reused', ''} when the id came with another request. A reply is stored behind its request's
-- fingerprint and a newline (replies are JSON: they hold no raw newline); one stored by an
-- older release has no fingerprint and is replayed as it is.
local function replayed(ctx)
  if ctx.idem_key == '' then
    return nil
  end
  local first = redis.call('GET', ctx.idem_key)
  if not first then
    return nil
  end
  local cut = string.find(first, '\n', 1, true)
  if cut then
    if string.sub(first, 1, cut - 1) ~= ctx.fingerprint then
      return {'reused', ''}
    end
    first = string.sub(first, cut + 1)
  end
  return {'replay', first}
end

-- Encode a verdict with the entry (its value only when asked), and remember it under the
-- message id for the window unless `forget` is set.
local function answer(ctx, status, entry, with_value, forget)
  local copy = {}
  for k, v in pairs(entry) do copy[k] = v end
  if not with_value then
    copy.val = ''
  elseif not copy.val then
    copy.val = redis.call('HGET', ctx.entry_key, 'val') or ''
  end
  local encoded = cjson.encode({status, copy})
  if ctx.idem_key ~= '' and not forget then
    redis.call('SET', ctx.idem_key, ctx.fingerprint .. '\n' .. encoded, 'PX', ctx.idem_window_ms)
  end
  return {status, encoded}
end
