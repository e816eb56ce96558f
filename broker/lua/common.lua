-- Shared helpers, prepended to every write script. Values only ever arrive as KEYS/ARGV.

local FIELDS = {'id', 'agent', 'val', 'ver', 'ca', 'ua', 'ts', 'ttl', 'exp', 'del', 'sv', 'cf', 'pr'}

-- An entry's fields but its value, which a write only needs in a reply that carries it
-- (`answer` fetches it then).
local META = {'id', 'agent', 'ver', 'ca', 'ua', 'ts', 'ttl', 'exp', 'del', 'sv', 'cf', 'pr'}

local function load_entry(entry_key)
  local values = redis.call('HMGET', entry_key, unpack(META))
  if not values[3] then
    return nil
  end
  local entry = {}
  for i, name in ipairs(META) do
    entry[name] = values[i] or ''
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

-- Drop the oldest change-log records beyond `maxlen`, in steps of about 1% so most writes skip
-- it, and remember the newest dropped id: a cursor before it has lost changes (a `reset`).
local function trim_log(log_key, meta_key, maxlen)
  local excess = redis.call('XLEN', log_key) - maxlen
  if excess <= 0 or excess < math.max(1, math.floor(maxlen / 100)) then
    return
  end
  local old = redis.call('XRANGE', log_key, '-', '+', 'COUNT', math.min(excess, 1000))
  local ids = {}
  for i, record in ipairs(old) do
    ids[i] = record[1]
  end
  redis.call('XDEL', log_key, unpack(ids))
  redis.call('HSET', meta_key, 'trimmed', ids[#ids])
end

-- Store a new version: entry hash, history, and one change-log record, all in this call.
local function commit(ctx, entry, change_type)
  redis.call('HSET', ctx.entry_key, unpack(flatten(entry)))
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
  local id = redis.call('XADD', ctx.log_key, '*', unpack(record))
  if not ctx.trim_later then  -- a script of many writes trims once, at the end
    trim_log(ctx.log_key, ctx.meta_key, tonumber(ctx.log_maxlen))
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

-- A write's context: its keys (entry, history, index, ttl, log, idempotency or '', meta), the
-- entry's name, the history and change-log limits, and the fingerprint of the request that
-- carries the message id ('' when it has none).
local function write_context(keys, key, history_limit, log_maxlen, fingerprint)
  return {
    entry_key = keys[1], history_key = keys[2], index_key = keys[3], ttl_key = keys[4],
    log_key = keys[5], idem_key = keys[6], meta_key = keys[7], key = key,
    history_limit = tonumber(history_limit), log_maxlen = log_maxlen,
    fingerprint = fingerprint or ''
  }
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
local function answer(ctx, window_ms, status, entry, with_value, forget)
  local copy = {}
  for k, v in pairs(entry) do copy[k] = v end
  if not with_value then
    copy.val = ''
  elseif not copy.val then
    copy.val = redis.call('HGET', ctx.entry_key, 'val') or ''
  end
  local encoded = cjson.encode({status, copy})
  if ctx.idem_key ~= '' and not forget then
    redis.call('SET', ctx.idem_key, ctx.fingerprint .. '\n' .. encoded, 'PX', window_ms)
  end
  return {status, encoded}
end
