-- AMP: the lifecycle engine's status changes, many cells per call (docs/amp.md, "Lifecycle").
-- A status change is a new version of the cell's MEMP entry like any write (entry, history,
-- one change-log record, one audit record, in this call), but it is not a put: no message id,
-- rate gate, conflict strategy or quota applies to the engine, and only the fields that
-- change are written. Each cell is a compare-and-set on the version the engine decided from:
-- a cell written since (a patch, another engine) is left alone, for the next run.
-- KEYS: read_cell_index_keys, read_status_keys, then read_entry_keys per cell, in order.
-- ARGV: read_cell_prefixes, read_status_call, then read_cell_status per cell (its id, MEMP
--   key, the version decided from, the new status, the new value and its content hash, and
--   its index update: reference time, due times, recheck mark; see amp_index.lua).
-- Returns per cell 'ok', or 'changed' where the entry is no longer that live version.
local x, key_at = read_cell_index_keys(KEYS, 1)
local k
k, key_at = read_status_keys(KEYS, key_at)
local p, at = read_cell_prefixes(ARGV, 1)
local call
call, at = read_status_call(ARGV, at)
local now = tonumber(call.now)
-- What the engine's version holds in these fields, whatever an earlier writer left there.
local RESET = {{'sv', ''}, {'cf', ''}, {'pr', '0'}, {'apb', ''}, {'pid', ''}}
local ctx = {
  log_key = k.log, meta_key = k.meta, usage_key = k.usage, audit_key = k.audit,
  history_limit = tonumber(call.history_limit), log_maxlen = tonumber(call.log_maxlen),
  actor = call.agent, key_id = '', request_id = '', mode = 'merge', trim_later = true,
}
local verdicts = {}
while at <= #ARGV do
  local e, c
  e, key_at = read_entry_keys(KEYS, key_at)
  c, at = read_cell_status(ARGV, at)
  local current = load_entry(e.entry)
  if not is_live(current, now) or current.ver ~= c.version then
    verdicts[#verdicts + 1] = 'changed'
  else
    ctx.entry_key, ctx.history_key, ctx.key = e.entry, e.history, c.key
    ctx.content_hash, ctx.action = c.content_hash, 'amp-' .. c.status
    local entry = current
    entry.val, entry.ver = c.value, tostring(tonumber(current.ver) + 1)
    entry.agent, entry.ua, entry.ts = call.agent, call.now, call.now
    local changed = {'val', 'ver', 'agent', 'ua', 'ts'}
    for _, reset in ipairs(RESET) do
      local name, value = reset[1], reset[2]
      if entry[name] ~= value then
        entry[name] = value
        changed[#changed + 1] = name
      end
    end
    count_bytes(ctx, #c.value - value_size(ctx))
    commit(ctx, entry, 'put', changed)
    index_cell(x, p, {
      id = c.id, key = c.key, version = '', status = c.status, ref = c.ref, count = '',
      accessed = '', created = '', due_stale = c.due_stale, due_archive = c.due_archive,
      due_expire = c.due_expire, due_purge = c.due_purge, recheck = c.recheck}, entry.ver)
    verdicts[#verdicts + 1] = 'ok'
  end
end
if #verdicts > 0 then
  trim_excess(ctx.log_key, ctx.meta_key, ctx.log_maxlen)
end
return verdicts
