-- AMP: the lifecycle engine's status changes, many cells per call (docs/amp.md, "Lifecycle").
-- A status change is a new version of the cell's MEMP entry like any write (entry, history,
-- one change-log record, one audit record, in this call), but it is not a put: no message id,
-- rate gate, conflict strategy or quota applies to the engine, and only the fields that
-- change are written. Each cell is a compare-and-set on the version the engine decided from:
-- a cell written since (a patch, another engine, an expiry or erasure) is left alone, for the
-- next run. Every change of an entry hash bumps its version, so while the version is the one
-- the engine read, the hash holds what the engine read: the fields a status change keeps
-- (id, created, TTL, expiry) come with it instead of being read again.
-- KEYS: read_cell_index_keys, read_status_keys, then read_entry_keys per cell, in order.
-- ARGV: read_cell_prefixes, read_status_call, then read_cell_status per cell: its id and MEMP
--   key; the version decided from and the kept fields of that version; the new status, value,
--   content hash and how many bytes longer the value grew; whether fields an earlier writer
--   set (schema errors, conflicts, priority, approval) must be cleared; and its index update
--   (reference time, due times, recheck mark; see amp_index.lua).
-- Returns per cell 'ok', or 'changed' where the entry is no longer that live version.
local x, key_at = read_cell_index_keys(KEYS, 1)
local k
k, key_at = read_status_keys(KEYS, key_at)
local p, at = read_cell_prefixes(ARGV, 1)
local call
call, at = read_status_call(ARGV, at)
local now = tonumber(call.now)
local ctx = {
  log_key = k.log, meta_key = k.meta, usage_key = k.usage, audit_key = k.audit,
  history_limit = tonumber(call.history_limit), log_maxlen = tonumber(call.log_maxlen),
  actor = call.agent, key_id = '', request_id = '', mode = 'merge', trim_later = true,
  audit_chain = {},
}
local WRITTEN = {'val', 'ver', 'agent', 'ua', 'ts'}
local CLEARED = {'val', 'ver', 'agent', 'ua', 'ts', 'sv', 'cf', 'pr', 'apb', 'pid'}
local verdicts = {}
local grown = 0
local held = held_sets()
while at <= #ARGV do
  local e, c
  e, key_at = read_entry_keys(KEYS, key_at)
  c, at = read_cell_status(ARGV, at)
  if redis.call('HGET', e.entry, 'ver') ~= c.version
      or (c.exp ~= '' and tonumber(c.exp) <= now) then
    verdicts[#verdicts + 1] = 'changed'
  else
    ctx.entry_key, ctx.history_key, ctx.key = e.entry, e.history, c.key
    ctx.content_hash, ctx.action = c.content_hash, 'amp-' .. c.status
    local entry = {
      id = c.entry_id, agent = call.agent, val = c.value,
      ver = tostring(tonumber(c.version) + 1), ca = c.created, ua = call.now, ts = call.now,
      ttl = c.ttl, exp = c.exp, del = '', sv = '', cf = '', pr = '0', apb = '', pid = ''}
    grown = grown + tonumber(c.grow)
    commit(ctx, entry, 'put', c.clear == '1' and CLEARED or WRITTEN)
    index_cell(x, p, {
      id = c.id, key = c.key, version = '', status = c.status, ref = c.ref, count = '',
      accessed = '', created = '', due_stale = c.due_stale, due_archive = c.due_archive,
      due_expire = c.due_expire, due_purge = c.due_purge, recheck = c.recheck}, entry.ver, held)
    verdicts[#verdicts + 1] = 'ok'
  end
end
flush_sets(held)
count_bytes(ctx, grown)
audit_flush(ctx.meta_key, ctx.audit_chain)
trim_excess(ctx.log_key, ctx.meta_key, ctx.log_maxlen)
return verdicts
