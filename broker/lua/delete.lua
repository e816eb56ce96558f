-- KEYS: entry, history, index, ttl, log, idempotency ('' when the message has no id), meta
-- ARGV: key, now, agent, ts, if_version, history_limit, log_maxlen, idem_window_ms,
--       ts_from_client ('1' or '0'), mode ('lww', 'priority' or 'merge'), writer priority,
--       priority of entries written before priorities were set, the request's fingerprint
local ctx = write_context(KEYS, ARGV[1], ARGV[6], ARGV[7], ARGV[13])
local first = replayed(ctx)
if first then
  return first
end

local now = tonumber(ARGV[2])
local agent = ARGV[3]
local ts = tonumber(ARGV[4])
local if_version = ARGV[5]

local function reply(status, entry, with_value)
  return answer(ctx, ARGV[8], status, entry, with_value, false)
end

local current = load_entry(ctx.entry_key)
if current and is_expired(current, now) then
  current = expire_entry(ctx, current, now)
end
if not is_live(current, now) then
  return reply('not_found', {ver = current and current.ver or '0', del = '1'}, false)
end
if if_version ~= '' and current.ver ~= if_version then
  return reply('precondition_failed', current, true)
end
local ts_text = ARGV[4]
local outranks = false
if ARGV[10] == 'priority' then
  local stored_priority = tonumber(current.pr) or tonumber(ARGV[12])
  if tonumber(ARGV[11]) < stored_priority then
    return reply('write_conflict', current, true)
  end
  outranks = tonumber(ARGV[11]) > stored_priority
end
if ARGV[10] == 'merge' or outranks then
  -- no timestamp contest: merge combines writes, a higher priority always wins
elseif ARGV[9] == '1' then
  if loses_to(current, ts, agent) then
    return reply('write_conflict', current, true)
  end
elseif current.ts ~= '' and ts <= tonumber(current.ts) then
  ts_text = string.format('%d', tonumber(current.ts) + 1)
end

local tomb = {
  id = current.id, agent = agent, val = '', ver = tostring(tonumber(current.ver) + 1),
  ca = current.ca, ua = ARGV[2], ts = ts_text, ttl = '', exp = '', del = '1', sv = '', cf = '',
  pr = ARGV[11]
}
redis.call('ZREM', ctx.index_key, ctx.key)
redis.call('ZREM', ctx.ttl_key, ctx.key)
tomb.log_id = commit(ctx, tomb, 'delete')
return reply('ok', tomb, false)
